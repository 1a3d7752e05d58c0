package oci

import "syscall"

type syscallStat = syscall.Stat_t

package unpack

import "syscall"

type syscallStat = syscall.Stat_t

// Command pipeline builds and measures gVisor checkpoints of the readie executor:
//
//	pipeline capture   capture, measure and smoke-test every package set, write manifest.json
//	pipeline measure   re-time the restores of an existing output directory
//	pipeline smoke     smoke-test an existing output directory again
//	pipeline verify    check manifest.json, every meta.json and every image file's hash
//	pipeline spec      print the sandbox spec of a mode and its fingerprint
//	pipeline version   print the pipeline's, runsc's and the protocol's versions
//
// Exit codes: 0 success, 1 a failed capture/measure/smoke/verify, 2 bad usage or config,
// 130 or 143 when interrupted by SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
)

const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitSIGINT  = 130
	exitSIGTERM = 143
)

// usageError marks bad usage or config: exit code 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// argsChecker is a command that says, before it runs, whether its positional arguments are
// right (dispatch and the deploy files' test call it).
type argsChecker interface {
	CheckArgs(g *globals, args []string) error
}

// command is one subcommand: its flags and what it does.
type command interface {
	Name() string
	Synopsis() string
	SetFlags(fs *flag.FlagSet)
	Execute(ctx context.Context, g *globals, args []string) error
}

func commands() []command {
	return []command{&captureCmd{}, &planCmd{}, &mergeCmd{}, &pushCmd{}, &pullCmd{}, &measureCmd{}, &smokeCmd{}, &verifyCmd{}, &benchCmd{}, &cacheCmd{}, &rootfsCmd{}, &specCmd{}, &versionCmd{}}
}

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr, signals))
}

var errUnknownCommand = errors.New("unknown command")

// parseCommandLine finds the command of args and parses its flags and the global ones; it
// runs nothing. Its complaints go to stderr.
func parseCommandLine(args []string, stdout, stderr io.Writer) (command, *globals, *flag.FlagSet, error) {
	var cmd command
	for _, c := range commands() {
		if c.Name() == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "pipeline: unknown command %q\n", args[0])
		return nil, nil, nil, fmt.Errorf("%w %q", errUnknownCommand, args[0])
	}
	g := &globals{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("pipeline "+cmd.Name(), flag.ContinueOnError)
	fs.SetOutput(stderr)
	g.register(fs)
	cmd.SetFlags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		return nil, nil, nil, err
	}
	if c, ok := cmd.(argsChecker); ok {
		if err := c.CheckArgs(g, fs.Args()); err != nil {
			fmt.Fprintf(stderr, "pipeline %s: %v\n", cmd.Name(), err)
			return nil, nil, nil, err
		}
	}
	return cmd, g, fs, nil
}

// dispatch runs one command line. A signal on signals stops the command: its context is
// cancelled, it deletes its sandboxes, and the exit code says which signal it was.
func dispatch(args []string, stdout, stderr io.Writer, signals <-chan os.Signal) int {
	cmds := commands()
	usage := func() {
		fmt.Fprintln(stderr, "usage: pipeline <command> [flags]\n\ncommands:")
		sort.Slice(cmds, func(i, j int) bool { return cmds[i].Name() < cmds[j].Name() })
		for _, c := range cmds {
			fmt.Fprintf(stderr, "  %-8s %s\n", c.Name(), c.Synopsis())
		}
		fmt.Fprintln(stderr, "\nrun `pipeline <command> -h` for its flags")
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		return exitUsage
	}
	cmd, g, fs, err := parseCommandLine(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		if errors.Is(err, errUnknownCommand) {
			usage()
		}
		return exitUsage
	}
	log, err := g.logger()
	if err != nil {
		fmt.Fprintf(stderr, "pipeline: %v\n", err)
		return exitUsage
	}
	g.log = log

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	caught := make(chan os.Signal, 1) // the signal that stopped the command, if one did
	done := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case s := <-signals:
			caught <- s
			log.WithField("signal", s.String()).Warn("interrupted: deleting sandboxes and stopping")
			cancel(fmt.Errorf("interrupted by %s", s))
		case <-done:
		}
	})
	err = cmd.Execute(ctx, g, fs.Args())
	close(done)
	watcher.Wait()
	var stoppedBy os.Signal
	select {
	case stoppedBy = <-caught:
	default:
	}
	if err == nil {
		return exitOK // finished before the signal could stop it
	}
	// Errors quote the executor's stderr over several lines: in text mode print them as they
	// are rather than as one escaped log field.
	if g.logFormat == "json" {
		log.WithField("command", cmd.Name()).Error(err)
	} else {
		fmt.Fprintf(stderr, "pipeline %s: %v\n", cmd.Name(), err)
	}
	switch {
	case stoppedBy == syscall.SIGINT:
		return exitSIGINT
	case stoppedBy == syscall.SIGTERM:
		return exitSIGTERM
	case isUsage(err):
		return exitUsage
	default:
		return exitFailed
	}
}

func newLogger(w io.Writer, format string, verbose bool) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(w)
	switch format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	if verbose {
		log.SetLevel(logrus.DebugLevel)
	}
	return log, nil
}

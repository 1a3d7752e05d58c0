// Command pipeline builds and measures gVisor checkpoints of the readie executor. Each
// subcommand is a type in a file of its own that holds its flags (SetFlags) and does its work
// (Execute) by calling the packages under internal/ and pkg/; `pipeline -h` lists them and
// `pipeline COMMAND -h` shows a command's flags.
//
// Exit codes: 0 success, 1 a failed capture/measure/smoke/verify/bench or a locked output,
// 2 bad usage, config or input, 3 check-host's verdict that some checkpoint will not restore
// on the host, 130 or 143 when interrupted by SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/analysis"
	"readie.dev/pipeline/internal/config"
	"readie.dev/pipeline/internal/importcost"
	"readie.dev/pipeline/internal/run"
	"readie.dev/pipeline/pkg/exitcode"
)

// The pipeline's exit codes, exitcode's; a signal's is exitcode.ForSignal's.
const (
	exitOK             = exitcode.OK
	exitFailed         = exitcode.Failed
	exitUsage          = exitcode.Usage
	exitDoesNotRestore = exitcode.DoesNotRestore
)

func commands() commandSet {
	return commandSet{name: "pipeline", commands: []command{
		&captureCmd{}, &planCmd{}, &mergeCmd{}, &pushCmd{}, &pullCmd{}, &measureCmd{}, &smokeCmd{},
		&verifyCmd{}, &checkHostCmd{}, &benchCmd{}, &analyzeCmd{}, &planSetsCmd{}, &selectCmd{}, newCacheGroup(), &rootfsCmd{}, &specCmd{}, &versionCmd{},
	}}
}

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr, signals))
}

// dispatch runs one command line. A signal on signals stops the command: its context is
// cancelled, it deletes its sandboxes, and the exit code says which signal it was.
func dispatch(args []string, stdout, stderr io.Writer, signals <-chan os.Signal) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...) // what people try first
	}
	p, err := commands().parse(args, stdout, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	c, err := p.logs.console(stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", p.path, err)
		return exitUsage
	}
	log := c.log

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	caught := make(chan os.Signal, 1) // the signal that stopped the command, if one did
	done := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case s := <-signals:
			caught <- s
			log.WithField("signal", signalName(s)).Warn("interrupted: deleting sandboxes and stopping")
			cancel(fmt.Errorf("interrupted (%s)", signalName(s)))
		case <-done:
		}
	})
	err = p.cmd.Execute(ctx, c, p.args)
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
	if c.json {
		log.WithField("command", p.cmd.Name()).Error(err)
	} else {
		fmt.Fprintf(stderr, "%s: %v\n", p.path, err)
	}
	return exitCode(err, stoppedBy)
}

// exitCode returns the code the pipeline exits with when a command returned err, stopped by
// the signal stoppedBy (nil when no signal stopped it).
func exitCode(err error, stoppedBy os.Signal) int {
	sig, signalled := stoppedBy.(syscall.Signal)
	switch {
	case err == nil:
		return exitOK
	case signalled:
		return exitcode.ForSignal(sig)
	case isUsage(err):
		return exitUsage
	case errors.Is(err, errDoesNotRestore):
		return exitDoesNotRestore // a verdict, which a script must tell from a check that failed
	}
	return exitFailed
}

// signalName is the signal as people write it: SIGINT, SIGTERM.
func signalName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u) || errors.Is(err, config.ErrInvalid)
}

// newEnv checks the runsc that cfg names and prepares a run; its captures (capture, bench
// --capture) find the analysis cache's figures for their catalogue the same way.
func newEnv(ctx context.Context, cfg *config.Config, con *console) (*run.Env, error) {
	env, err := run.NewEnv(ctx, cfg, con.log)
	if err != nil {
		return nil, usageIfSetup(err)
	}
	env.Analyses = cachedAnalyses(env, cfg, con.log)
	env.Progress = con.progress
	return env, nil
}

// cachedAnalyses returns the lookup of modules in the analysis cache on a capture's sandboxes
// (its rootfs resolved once): the cache's figures when it holds them whole, else nil. It
// measures nothing.
func cachedAnalyses(env *run.Env, cfg *config.Config, log logrus.FieldLogger) run.AnalysisLookup {
	return func(ctx context.Context, sb *run.Sandboxes, names []string) *analysis.File {
		a, _, err := importcost.Run(ctx, env, names, importcost.Options{
			Runs: cfg.Analysis.Runs, Jobs: 1, Timeout: cfg.Analysis.Timeout, CacheDir: cfg.Analysis.Cache,
			RestoreRuns: cfg.RestoreRuns, CacheOnly: true, Log: log, Sandboxes: sb,
		})
		if err != nil {
			log.WithError(err).Debug("catalogue: no analysis of these sets in the analysis cache")
			return nil
		}
		return a
	}
}

func usageIfSetup(err error) error {
	if errors.Is(err, run.ErrSetup) {
		return usageError{err}
	}
	return err
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

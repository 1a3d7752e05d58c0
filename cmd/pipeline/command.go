package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/sirupsen/logrus"

	"readie.dev/pipeline/internal/progress"
)

// command is one subcommand in the style of gVisor's runsc/cmd: a type that holds its own
// flags (SetFlags registers exactly those that apply to it) and does its work in Execute.
type command interface {
	Name() string
	Synopsis() string
	// Usage is the line after "usage: pipeline": the command and its arguments.
	Usage() string
	SetFlags(fs *flag.FlagSet)
	Execute(ctx context.Context, c *console, args []string) error
}

// argsChecker is a command that checks its positional arguments right after parsing, before
// anything runs (dispatch and the deploy files' test both call it).
type argsChecker interface {
	CheckArgs(args []string) error
}

// console is where one command run writes: its results on stdout, logs and progress on stderr.
type console struct {
	stdout, stderr io.Writer
	log            *logrus.Logger
	// json says the logs are JSON (--log-format json): summaries on stdout are JSON too.
	json bool
	// progress says what a long command is doing as it goes, on stderr; nil with -q or JSON
	// logs (a reader of JSON lines gets none of them).
	progress *progress.Meter
}

// logFlags are the only flags every command takes: they shape what it writes, not what it does.
type logFlags struct {
	format  string
	verbose bool
	quiet   bool
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format on stderr: text or json (with json, summaries on stdout are JSON too)")
	fs.BoolVar(&l.verbose, "v", false, "debug logging")
	fs.BoolVar(&l.quiet, "q", false, "no progress lines on stderr (sets done of N, rounds, bytes); JSON logs have none either")
}

func (l *logFlags) console(stdout, stderr io.Writer) (*console, error) {
	log, err := newLogger(stderr, l.format, l.verbose)
	if err != nil {
		return nil, err
	}
	meter := progress.New(stderr, l.quiet || l.format == "json")
	log.SetOutput(meter.Logs(stderr))
	return &console{stdout: stdout, stderr: stderr, log: log, json: l.format == "json", progress: meter}, nil
}

// commandSet is a list of commands under one name: the pipeline itself, or a group such as
// `pipeline cache`.
type commandSet struct {
	name     string // "pipeline" or "pipeline cache"
	commands []command
}

var errUnknownCommand = errors.New("unknown command")

func (s commandSet) find(name string) (command, error) {
	for _, c := range s.commands {
		if c.Name() == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("%w %q (%s)", errUnknownCommand, name, s.names())
}

func (s commandSet) names() string {
	var names []string
	for _, c := range s.commands {
		names = append(names, c.Name())
	}
	sort.Strings(names)
	return "want one of " + strings.Join(names, ", ")
}

// printUsage lists the set's commands with their synopses.
func (s commandSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: %s <command> [flags] [arguments]\n\ncommands:\n", s.name)
	cmds := append([]command(nil), s.commands...)
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].Name() < cmds[j].Name() })
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-12s %s\n", c.Name(), c.Synopsis())
	}
	fmt.Fprintf(w, "\nrun `%s help <command>` or `%s <command> -h` for a command's flags\n", s.name, s.name)
}

// help prints the usage of the command that args name, descending into groups (`pipeline help
// cache prune`), or the set's own list with none. It returns flag.ErrHelp once it printed, a
// usage error for a name the set lacks.
func (s commandSet) help(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		s.printUsage(stdout)
		return flag.ErrHelp
	}
	cmd, err := s.find(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "%s help: %v\n", s.name, err)
		return usageError{err}
	}
	if g, ok := cmd.(*group); ok {
		return g.set.help(args[1:], stdout, stderr)
	}
	path := s.name + " " + cmd.Name()
	if len(args) > 1 {
		err := fmt.Errorf("unexpected arguments: %s (name one command)", strings.Join(args[1:], " "))
		fmt.Fprintf(stderr, "%s help: %v\n", s.name, err)
		return usageError{err}
	}
	printCommandUsage(stdout, cmd, flagSet(path, cmd, &logFlags{}))
	return flag.ErrHelp
}

// flagSet holds the flags that cmd takes: logs's, which every command takes, then its own.
func flagSet(path string, cmd command, logs *logFlags) *flag.FlagSet {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported by parse in one line, not with every flag
	logs.register(fs)
	cmd.SetFlags(fs)
	return fs
}

// parsed is a command line ready to run: the command, its positional arguments, its console.
type parsed struct {
	cmd  command
	args []string
	logs logFlags
	path string // "pipeline capture", "pipeline cache list"
}

// parse finds the command of args (descending into groups) and parses its flags; it runs
// nothing. Help (-h, --help, help [COMMAND]) goes to stdout and returns flag.ErrHelp: asked
// for, it is the command's output. Complaints go to stderr in one line.
func (s commandSet) parse(args []string, stdout, stderr io.Writer) (*parsed, error) {
	if len(args) == 0 {
		s.printUsage(stderr)
		return nil, usagef("%s: name a command", s.name)
	}
	switch args[0] {
	case "-h", "-help", "--help":
		s.printUsage(stdout)
		return nil, flag.ErrHelp
	case "help":
		return nil, s.help(args[1:], stdout, stderr)
	}
	cmd, err := s.find(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", s.name, err)
		return nil, usageError{err}
	}
	if g, ok := cmd.(*group); ok {
		return g.set.parse(args[1:], stdout, stderr)
	}
	p := &parsed{cmd: cmd, path: s.name + " " + cmd.Name()}
	fs := flagSet(p.path, cmd, &p.logs)
	if err := parseInterspersed(fs, args[1:], &p.args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printCommandUsage(stdout, cmd, fs)
			return nil, err
		}
		// The flag package names flags with one dash; the pipeline's words use two.
		words := strings.NewReplacer("for flag -", "for flag --", "not defined: -", "not defined: --").Replace(err.Error())
		fmt.Fprintf(stderr, "%s: %s (run `%s -h` for its flags)\n", p.path, words, p.path)
		return nil, usageError{err}
	}
	if c, ok := cmd.(argsChecker); ok {
		if err := c.CheckArgs(p.args); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", p.path, err)
			return nil, usageError{err}
		}
	}
	return p, nil
}

// parseInterspersed parses flags before and after positional arguments (`bench OUT --rounds
// 3`), as users type them; `--` ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string, positional *[]string) error {
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return nil
		}
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			*positional = append(*positional, rest...)
			return nil
		}
		*positional = append(*positional, rest[0])
		args = rest[1:]
	}
}

func printCommandUsage(w io.Writer, cmd command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: pipeline %s\n\n%s\n\nflags:\n", cmd.Usage(), cmd.Synopsis())
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// group is a command whose first argument names a command of its own (`pipeline cache list`).
type group struct {
	name, synopsis string
	set            commandSet
}

func newGroup(name, synopsis string, commands ...command) *group {
	return &group{name: name, synopsis: synopsis, set: commandSet{name: "pipeline " + name, commands: commands}}
}

func (g *group) Name() string              { return g.name }
func (g *group) Synopsis() string          { return g.synopsis }
func (g *group) Usage() string             { return g.name + " <command> [flags]" }
func (g *group) SetFlags(fs *flag.FlagSet) {}
func (g *group) Execute(context.Context, *console, []string) error {
	return errors.New("a command group runs one of its commands") // parse descends instead
}

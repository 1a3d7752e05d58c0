package sandbox

import (
	"fmt"
	"slices"
	"strings"
)

// Flags are runsc's global flags that shape a sandbox. A restore must use the same ones as
// the capture, so the manifest records them (runsc_flags, Args) and Fingerprint covers the
// network and the overlay.
type Flags struct {
	Network string // --network: "none" keeps sandboxes off every network
	Overlay string // --overlay2: "none" with a read-only root
	// HostUDS is --host-uds: "create" lets the executor's bind() of its socket reach the host;
	// with runsc's default the gofer refuses it and a dial from the host waits forever.
	HostUDS string
	// Extra are further global flags, e.g. "--ignore-cgroups": only those CheckGlobalFlag
	// allows.
	Extra []string
}

// Args returns the flags as runsc arguments: a manifest's runsc_flags, and the GlobalArgs
// of a runsc.Runsc.
func (f Flags) Args() []string {
	return append([]string{"--network=" + f.Network, "--overlay2=" + f.Overlay, "--host-uds=" + f.HostUDS}, f.Extra...)
}

// DefaultFlags returns the global flags the pipeline uses unless its config says otherwise.
func DefaultFlags() Flags {
	return Flags{Network: "none", Overlay: "none", HostUDS: "create"}
}

// The values a sandbox's own flags may take. A manifest comes from whoever pushed the output,
// and a worker runs runsc as root with its flags: each one is a value this pipeline writes,
// never, say, --network=host, a --debug-log path on the host or --allow-flag-override.
var (
	networks = []string{"none", "sandbox"}
	// Not "self": runsc would keep the overlay's file store in the host directory of the
	// worker's rootfs, as root.
	overlays  = []string{"none", "root:memory", "all:memory"}
	hostUDSes = []string{"create", "all"}
	// extraFlags are the further global flags allowed, with their allowed values ("" for a
	// flag without one).
	extraFlags = map[string][]string{
		"ignore-cgroups": {"", "true", "false"},
		"platform":       {"systrap", "ptrace", "kvm"},
		"directfs":       {"", "true", "false"},
		"file-access":    {"exclusive", "shared"},
		// Boot knobs a bench variant may measure (docs/knobs.md): skip the host settings
		// check (never adjust or enforce: they write the host's settings), and application
		// huge pages on or off.
		"host-settings":  {"ignore", "check"},
		"app-huge-pages": {"", "true", "false"},
	}
	// restoreFlags are the flags of `runsc restore` that only change how it loads the image.
	restoreFlags = map[string][]string{
		"direct":     {"", "true", "false"},
		"background": {"", "true", "false"},
	}
)

// ParseFlags reads back the global flags that Flags.Args wrote (a manifest's runsc_flags), so
// an existing output is restored with the flags it was captured with. It refuses any flag or
// value outside the allowed ones, naming it.
func ParseFlags(args []string) (Flags, error) {
	var f Flags
	for _, arg := range args {
		name, value, _ := strings.Cut(arg, "=")
		switch name {
		case "--network":
			f.Network = value
		case "--overlay2":
			f.Overlay = value
		case "--host-uds":
			f.HostUDS = value
		default:
			if err := CheckGlobalFlag(arg); err != nil {
				return Flags{}, err
			}
			f.Extra = append(f.Extra, arg)
			continue
		}
		if err := CheckOwnFlag(name, value); err != nil {
			return Flags{}, fmt.Errorf("runsc flag %q: %w", arg, err)
		}
	}
	if f.Network == "" || f.Overlay == "" || f.HostUDS == "" {
		return Flags{}, fmt.Errorf("runsc flags %q lack --network, --overlay2 or --host-uds", args)
	}
	return f, nil
}

// CheckOwnFlag refuses a value of --network, --overlay2 or --host-uds outside the ones a
// sandbox of the pipeline may have (no host network).
func CheckOwnFlag(flag, value string) error {
	allowed := map[string][]string{"--network": networks, "--overlay2": overlays, "--host-uds": hostUDSes}[flag]
	if !slices.Contains(allowed, value) {
		return fmt.Errorf("%s takes one of %s", flag, strings.Join(allowed, ", "))
	}
	return nil
}

// CheckGlobalFlag refuses a further runsc global flag (Flags.Extra) that is not one of
// --ignore-cgroups, --platform, --directfs, --file-access, --host-settings and
// --app-huge-pages with a value runsc takes.
func CheckGlobalFlag(arg string) error {
	return checkFlag("runsc flag", arg, "--", extraFlags)
}

// CheckRestoreFlags refuses restore flags (a manifest's restore_flags) other than -direct and
// -background, the flags that change only how `runsc restore` reads the image.
func CheckRestoreFlags(args []string) error {
	for _, arg := range args {
		if err := checkFlag("restore flag", arg, "-", restoreFlags); err != nil {
			return err
		}
	}
	return nil
}

func checkFlag(what, arg, dashes string, allowed map[string][]string) error {
	name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-"), "=")
	if !strings.HasPrefix(arg, "-") || !strings.HasPrefix(arg, dashes) {
		return fmt.Errorf("%s %q is not a flag (%sNAME)", what, arg, dashes)
	}
	values, ok := allowed[name]
	if !ok {
		names := make([]string, 0, len(allowed))
		for n := range allowed {
			names = append(names, dashes+n)
		}
		slices.Sort(names)
		return fmt.Errorf("%s %q is not one of %s (a manifest's flags reach runsc as root: only these are accepted)", what, arg, strings.Join(names, ", "))
	}
	if hasValue && value == "" || !slices.Contains(values, value) {
		return fmt.Errorf("%s %q: --%s takes one of %q", what, arg, name, values)
	}
	return nil
}

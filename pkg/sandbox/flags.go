package sandbox

import (
	"fmt"
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
	// Extra are further global flags, e.g. "--ignore-cgroups".
	Extra []string
}

// Args returns the flags as runsc arguments: a manifest's runsc_flags, and the GlobalArgs
// of a runsc.Runsc.
func (f Flags) Args() []string {
	return append([]string{"--network=" + f.Network, "--overlay2=" + f.Overlay, "--host-uds=" + f.HostUDS}, f.Extra...)
}

// DefaultFlags are the global flags the pipeline uses unless its config says otherwise.
func DefaultFlags() Flags {
	return Flags{Network: "none", Overlay: "none", HostUDS: "create"}
}

// ParseFlags reads back the global flags that Flags.Args wrote (a manifest's runsc_flags), so
// an existing output is restored with the flags it was captured with.
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
			if !strings.HasPrefix(arg, "--") {
				return Flags{}, fmt.Errorf("runsc flag %q is not a --flag", arg)
			}
			f.Extra = append(f.Extra, arg)
		}
	}
	if f.Network == "" || f.Overlay == "" || f.HostUDS == "" {
		return Flags{}, fmt.Errorf("runsc flags %q lack --network, --overlay2 or --host-uds", args)
	}
	return f, nil
}

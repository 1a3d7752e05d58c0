// Package imageconfig turns an image config's Env, WorkingDir and User into the process every
// sandbox made from the image runs (sandbox.Process), the way a container runtime would. The
// user is resolved in the image's own /etc/passwd and /etc/group, read as data through an
// os.Root: nothing of the image runs on the host.
package imageconfig

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"readie.dev/pipeline/pkg/sandbox"
)

// ErrConfig reports an image config the pipeline cannot honour.
var ErrConfig = errors.New("image config cannot be honoured")

// maxDatabase bounds what is read of /etc/passwd and /etc/group.
const maxDatabase = 4 << 20

// Process returns the process of cfg for the image unpacked at rootfs: Env as the config gives
// it, with HOME from the user's /etc/passwd entry unless Env sets it; WorkingDir, which must be
// a directory of the image (the root is read-only: nothing can make it); User as numbers: NAME,
// UID, NAME:GROUP, UID:GID (or mixed), a named user's supplementary groups from /etc/group when
// no group is given. A name the image does not define is refused, naming it.
func Process(cfg v1.Config, rootfs string) (sandbox.Process, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return sandbox.Process{}, err
	}
	defer root.Close()
	p := sandbox.Process{Env: slices.Clone(cfg.Env), Cwd: cfg.WorkingDir}
	if err := p.Check(); err != nil {
		return sandbox.Process{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if p.Cwd != "" {
		p.Cwd = path.Clean(p.Cwd)
		fi, err := root.Stat(strings.TrimPrefix(p.Cwd, "/"))
		if p.Cwd != "/" && (err != nil || !fi.IsDir()) {
			return sandbox.Process{}, fmt.Errorf("%w: WorkingDir %q is not a directory of the image (the root is read-only: it cannot be made)", ErrConfig, cfg.WorkingDir)
		}
		if p.Cwd == "/" {
			p.Cwd = ""
		}
	}
	user, home, err := resolveUser(root, cfg.User)
	if err != nil {
		return sandbox.Process{}, fmt.Errorf("%w: User %q: %w", ErrConfig, cfg.User, err)
	}
	p.User = user
	if !slices.ContainsFunc(p.Env, func(kv string) bool { return strings.HasPrefix(kv, "HOME=") }) && home != "" {
		p.Env = append(p.Env, "HOME="+home)
	}
	return p, nil
}

// passwdEntry is a line of /etc/passwd: name, uid, gid, home.
type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// groupEntry is a line of /etc/group: name, gid, members.
type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// resolveUser returns spec's user of the config's User, and the home directory /etc/passwd
// gives it ("" when the image has no entry for it).
func resolveUser(root *os.Root, spec string) (specs.User, string, error) {
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	if userPart == "" && hasGroup {
		return specs.User{}, "", errors.New("no user before the colon")
	}
	if hasGroup && groupPart == "" {
		return specs.User{}, "", errors.New("no group after the colon")
	}
	if userPart == "" {
		userPart = "0"
	}
	users, err := readPasswd(root)
	if err != nil {
		return specs.User{}, "", err
	}
	var u specs.User
	var entry *passwdEntry
	if uid, ok := number(userPart); ok {
		u.UID = uid
		for i := range users {
			if users[i].uid == uid {
				entry = &users[i]
				break
			}
		}
	} else {
		for i := range users {
			if users[i].name == userPart {
				entry = &users[i]
				break
			}
		}
		if entry == nil {
			return specs.User{}, "", fmt.Errorf("no user %q in the image's /etc/passwd", userPart)
		}
		u.UID = entry.uid
	}
	home := ""
	if entry != nil {
		u.GID, home = entry.gid, entry.home
	} else if u.UID != 0 {
		home = "/" // as runc: a user without an entry has no home of its own
	}
	if !hasGroup && entry == nil {
		return u, home, nil
	}
	groups, err := readGroup(root)
	if err != nil {
		return specs.User{}, "", err
	}
	if hasGroup {
		if gid, ok := number(groupPart); ok {
			u.GID = gid
		} else {
			i := slices.IndexFunc(groups, func(g groupEntry) bool { return g.name == groupPart })
			if i < 0 {
				return specs.User{}, "", fmt.Errorf("no group %q in the image's /etc/group", groupPart)
			}
			u.GID = groups[i].gid
		}
		return u, home, nil
	}
	// A named or listed user without a group: the supplementary groups it is a member of.
	for _, g := range groups {
		if g.gid != u.GID && slices.Contains(g.members, entry.name) && !slices.Contains(u.AdditionalGids, g.gid) {
			u.AdditionalGids = append(u.AdditionalGids, g.gid)
		}
	}
	return u, home, nil
}

// number reads a uid or gid.
func number(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// readDatabase reads /etc/NAME of the image as lines of colon-separated fields; a missing
// file is no lines.
func readDatabase(root *os.Root, name string) ([][]string, error) {
	// O_NONBLOCK: a FIFO there (the unpack makes one when a layer says so) would otherwise
	// block the open until a writer comes, which none will.
	f, err := root.OpenFile(path.Join("etc", name), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("the image's /etc/%s: %w", name, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("the image's /etc/%s: %w", name, err)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("the image's /etc/%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxDatabase+1))
	if err != nil {
		return nil, fmt.Errorf("the image's /etc/%s: %w", name, err)
	}
	if len(data) > maxDatabase {
		return nil, fmt.Errorf("the image's /etc/%s is larger than %d MiB", name, maxDatabase>>20)
	}
	var lines [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), maxDatabase)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, strings.Split(line, ":"))
	}
	return lines, sc.Err()
}

func readPasswd(root *os.Root) ([]passwdEntry, error) {
	lines, err := readDatabase(root, "passwd")
	if err != nil {
		return nil, err
	}
	var users []passwdEntry
	for _, f := range lines {
		if len(f) < 7 {
			continue // as libc: a malformed line names no one
		}
		uid, ok1 := number(f[2])
		gid, ok2 := number(f[3])
		if ok1 && ok2 {
			users = append(users, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
		}
	}
	return users, nil
}

func readGroup(root *os.Root) ([]groupEntry, error) {
	lines, err := readDatabase(root, "group")
	if err != nil {
		return nil, err
	}
	var groups []groupEntry
	for _, f := range lines {
		if len(f) < 4 {
			continue
		}
		gid, ok := number(f[2])
		if !ok {
			continue
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		groups = append(groups, groupEntry{name: f[0], gid: gid, members: members})
	}
	return groups, nil
}

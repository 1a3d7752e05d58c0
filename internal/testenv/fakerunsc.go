package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FakeRunsc writes a stand-in for runsc, for unit tests of the logic around it (never the only
// test of a behaviour): `list` prints listJSON, `delete` of an ID containing "fail" fails with
// runsc-like words (on stderr, and as a JSON line on --log-fd when given, as runsc does), every command named in failing fails for every ID (with exit status 3 and
// the same words), every other command succeeds. It returns the binary and a function that
// reads the command lines it was called with.
func FakeRunsc(t testing.TB, listJSON string, failing ...string) (string, func() []string) {
	t.Helper()
	dir := t.TempDir()
	fail := "never-a-command"
	if len(failing) > 0 {
		fail = strings.Join(failing, "|")
	}
	script := `#!/bin/sh
echo "$*" >> "` + dir + `/calls.log"
for last; do :; done
logfd=
say() {
  echo "$1" >&2
  if [ -n "$logfd" ]; then eval 'printf "{\"msg\":\"%s\",\"level\":\"error\"}\n" "$1" >&'"$logfd"; fi
}
for a in "$@"; do
  case "$a" in
    --log-fd=*) logfd="${a#--log-fd=}" ;;
    --version) echo "runsc version fake"; exit 0 ;;
    ` + fail + `) say "$a: device or resource busy"; exit 3 ;;
    list) cat "` + dir + `/list.json"; exit 0 ;;
    delete) case "$last" in *fail*) say "destroying container: device or resource busy"; exit 128 ;; esac; exit 0 ;;
    run|create|start|restore|kill|state) exit 0 ;;
  esac
done
exit 0
`
	if err := os.WriteFile(filepath.Join(dir, "list.json"), []byte(listJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "runsc")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, func() []string {
		data, _ := os.ReadFile(filepath.Join(dir, "calls.log"))
		return strings.Split(strings.TrimSpace(string(data)), "\n")
	}
}

package consultest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvBinary names the environment variable that, when set, gives the path of
// the consul binary to use and overrides every other lookup.
const EnvBinary = "LOCKBROKER_CONSUL"

// modulePath is the module whose root holds bin/consul.
const modulePath = "github.com/lockbroker/lockbroker"

// Binary returns the path of the consul binary to run: $LOCKBROKER_CONSUL if
// set (it must then name an executable file), else <repo root>/bin/consul if
// it exists, else `consul` on PATH. The repo root is the nearest directory,
// walking up from the working directory and then from this package's source
// directory, whose go.mod declares module github.com/lockbroker/lockbroker.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("consultest: $%s: %w", EnvBinary, err)
		}
		return filepath.Abs(p)
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		if root, ok := repoRoot(dir); ok {
			p := filepath.Join(root, "bin", "consul")
			if checkExecutable(p) == nil {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath("consul"); err == nil {
		return filepath.Abs(p)
	}
	return "", errors.New("consultest: no consul binary found: set $" + EnvBinary +
		", build <repo>/bin/consul from tools/consul, or put consul on PATH")
}

// checkExecutable reports why path is not an executable regular file.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// repoRoot walks up from dir to the directory whose go.mod declares modulePath.
func repoRoot(dir string) (string, bool) {
	for {
		if goModModule(filepath.Join(dir, "go.mod")) == modulePath {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// goModModule returns the module path declared in the go.mod at path, or "".
func goModModule(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line, _, _ := strings.Cut(s.Text(), "//")
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], "\"`")
		}
	}
	return ""
}

package brokertest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// modulePath is the module whose root Build and RepoRoot look for.
const modulePath = "github.com/lockbroker/lockbroker"

// Build runs `go build -o <t.TempDir()>/name pkg` in the repository root
// (pkg is relative to it, e.g. "./cmd/lockctl") and returns the binary's
// path. The Go build cache makes repeated builds cheap.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	return BuildIn(t, RepoRoot(t), pkg, name)
}

// BuildIn is Build run in dir, for packages of another module such as the
// pinned tools in tools/go (BuildIn(t, root+"/tools/go",
// "github.com/fullstorydev/grpcurl/cmd/grpcurl", "grpcurl")).
func BuildIn(t testing.TB, dir, pkg, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("brokertest: go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	return out
}

// RepoRoot returns the root of the lockbroker repository: the nearest
// directory above the working directory whose go.mod declares it.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if goModModule(filepath.Join(dir, "go.mod")) == modulePath {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("brokertest: no directory above the working directory holds module %s", modulePath)
		}
		dir = parent
	}
}

// goModModule returns the module path declared by the go.mod at path, or "".
func goModModule(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], "\"`")
		}
	}
	return ""
}

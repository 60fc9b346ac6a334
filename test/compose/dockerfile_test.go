package compose_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// instr is one Dockerfile instruction: "RUN", and its arguments with
// continuation lines joined.
type instr struct{ cmd, args string }

// stage is the instructions from one FROM to the next.
type stage struct {
	from   string // the FROM arguments, e.g. "golang:1.26 AS build"
	instrs []instr
}

// dockerfile is a parsed Dockerfile.
type dockerfile struct{ stages []stage }

// parseDockerfile splits the Dockerfile at path into stages of
// instructions. It understands comments and backslash continuations, which
// is all this repository's Dockerfile uses.
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var (
		df      dockerfile
		pending string
	)
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if strings.HasPrefix(line, "#") || (line == "" && pending == "") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			pending += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, pending = pending+line, ""
		cmd, args, _ := strings.Cut(line, " ")
		in := instr{cmd: strings.ToUpper(cmd), args: strings.Join(strings.Fields(args), " ")}
		if in.cmd == "FROM" {
			df.stages = append(df.stages, stage{from: in.args})
			continue
		}
		require.NotEmpty(t, df.stages, "%s: instruction before FROM: %s", path, line)
		last := &df.stages[len(df.stages)-1]
		last.instrs = append(last.instrs, in)
	}
	require.NoError(t, s.Err())
	require.NotEmpty(t, df.stages, "%s has no FROM", path)
	return df
}

// all returns the arguments of every cmd instruction of the stage.
func (s stage) all(cmd string) []string {
	var out []string
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

// goBuildRE matches one static, trimmed `go build` of a command package.
var goBuildRE = regexp.MustCompile(`CGO_ENABLED=0 go build -trimpath(?: +-\S+(?: +"[^"]*")?)* -o (\S+) (\./cmd/\w+)`)

func TestDockerfile(t *testing.T) {
	root := brokertest.RepoRoot(t)
	df := parseDockerfile(t, filepath.Join(root, "Dockerfile"))
	require.Len(t, df.stages, 2, "a build stage and a final stage")
	build, final := df.stages[0], df.stages[1]

	assert.Equal(t, "golang:1.26 AS build", build.from)
	builds := map[string]string{} // package -> output
	for _, run := range build.all("RUN") {
		for _, m := range goBuildRE.FindAllStringSubmatch(run, -1) {
			builds[m[2]] = m[1]
		}
	}
	assert.Equal(t, map[string]string{"./cmd/broker": "/out/broker", "./cmd/lockctl": "/out/lockctl"}, builds,
		"static -trimpath builds of the broker and lockctl")

	assert.Regexp(t, `^(gcr\.io/distroless/static\S*|scratch)$`, final.from, "a final image without a shell or package manager")
	users := final.all("USER")
	require.NotEmpty(t, users, "the final stage must set USER")
	user := users[len(users)-1]
	assert.NotContains(t, []string{"root", "0", "0:0", "root:root"}, user, "the broker must not run as root")
	assert.Equal(t, "65532:65532", user, "distroless's nonroot user, numeric so that runAsNonRoot can check it")
	assert.Equal(t, []string{"8700 8701"}, final.all("EXPOSE"))
	assert.Equal(t, []string{`["/usr/local/bin/broker"]`}, final.all("ENTRYPOINT"))
	assert.Contains(t, final.all("COPY"), "--from=build /out/broker /out/lockctl /usr/local/bin/")
}

// TestMakefileBuildsLikeDockerfile checks that the image builds the same
// command packages as the Makefile, with every flag the Makefile passes
// (the image adds CGO_ENABLED=0 and -trimpath for a static, reproducible
// binary).
func TestMakefileBuildsLikeDockerfile(t *testing.T) {
	root := brokertest.RepoRoot(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if os.IsNotExist(err) {
		t.Skip("no Makefile yet")
	}
	require.NoError(t, err)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	mkBuilds, dfBuilds := goBuilds(string(mk)), goBuilds(string(df))
	require.NotEmpty(t, mkBuilds, "no `go build ... ./cmd/X` in the Makefile")
	for pkg, flags := range mkBuilds {
		dfFlags, ok := dfBuilds[pkg]
		if !assert.True(t, ok, "the Makefile builds %s, the Dockerfile does not", pkg) {
			continue
		}
		for _, f := range flags {
			assert.Contains(t, dfFlags, f, "the Makefile builds %s with %s, the Dockerfile does not", pkg, f)
		}
	}
}

// buildLineRE matches `go build [flags] -o OUT ./cmd/NAME`, also as $(GO);
// a flag may take a quoted argument (`-ldflags '...'`).
var buildLineRE = regexp.MustCompile(`(?:\$\(GO\)|\bgo) build((?: +-\S+(?: +'[^']*'| +"[^"]*")?)*?) +-o +\S+((?: +-\S+(?: +'[^']*'| +"[^"]*")?)*) +(\./cmd/\w+)`)

// quotedRE is a quoted flag argument: its contents differ between the
// Makefile (make variables) and the Dockerfile (build arguments), so only
// the flag it belongs to is compared.
var quotedRE = regexp.MustCompile(`'[^']*'|"[^"]*"`)

// goBuilds maps each ./cmd package built in text to its build flags.
func goBuilds(text string) map[string][]string {
	out := map[string][]string{}
	for _, m := range buildLineRE.FindAllStringSubmatch(text, -1) {
		out[m[3]] = strings.Fields(quotedRE.ReplaceAllString(m[1]+" "+m[2], ""))
	}
	return out
}

func TestGoBuilds(t *testing.T) {
	tests := []struct {
		name, text string
		want       map[string][]string
	}{
		{"make", "\t$(GO) build -o bin/broker ./cmd/broker\n", map[string][]string{"./cmd/broker": nil}},
		{"flags", "CGO_ENABLED=0 go build -trimpath -o /out/lockctl -ldflags=-s ./cmd/lockctl &&",
			map[string][]string{"./cmd/lockctl": {"-trimpath", "-ldflags=-s"}}},
		{"other package", "go build -o bin/x ./internal/x", map[string][]string{}},
		{"quoted flag", "\t$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/broker ./cmd/broker\n",
			map[string][]string{"./cmd/broker": {"-trimpath", "-ldflags"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := goBuilds(tt.text)
			for pkg, flags := range got {
				if len(flags) == 0 {
					got[pkg] = nil
				}
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

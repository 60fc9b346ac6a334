// Package readme reads the shell blocks of the repository's README.md that
// tests run as written. A block is named by an HTML comment on the line
// before its opening fence, which Markdown does not show:
//
//	<!-- test: grpcurl-hold -->
//	```sh
//	grpcurl ...
//	```
//
// A test that runs a block fails when the README loses it, so the README
// and the test cannot drift apart unnoticed.
package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// marker is the comment that names the block after it.
var marker = regexp.MustCompile(`^<!-- test: ([a-z0-9-]+) -->$`)

// Block returns the body of README.md's block name (without its fences).
// It fails t when there is no such block, or more than one.
func Block(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(brokertest.RepoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parse(string(data))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	b, ok := blocks[name]
	if !ok {
		t.Fatalf("README.md has no block marked <!-- test: %s -->", name)
	}
	return b
}

// parse returns every marked block of a Markdown text by name.
func parse(text string) (map[string]string, error) {
	blocks := map[string]string{}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := marker.FindStringSubmatch(strings.TrimSpace(lines[i]))
		if m == nil {
			continue
		}
		name := m[1]
		if _, dup := blocks[name]; dup {
			return nil, fmt.Errorf("line %d: a second block named %q", i+1, name)
		}
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			return nil, fmt.Errorf("line %d: <!-- test: %s --> is not followed by a fenced block", i+1, name)
		}
		var body []string
		j := i + 2
		for ; j < len(lines) && !strings.HasPrefix(lines[j], "```"); j++ {
			body = append(body, lines[j])
		}
		if j == len(lines) {
			return nil, fmt.Errorf("line %d: block %q has no closing fence", i+2, name)
		}
		blocks[name] = strings.Join(body, "\n") + "\n"
		i = j
	}
	return blocks, nil
}

// Commands splits a block into its commands: lines joined across a
// trailing backslash, without blank lines and comment lines.
func Commands(block string) []string {
	var cmds []string
	var cur strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if cur.Len() == 0 {
			trimmed := strings.TrimSpace(line)
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cur.WriteString(line)
		cmds = append(cmds, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		cmds = append(cmds, cur.String())
	}
	return cmds
}

// Package install_test runs the README's install blocks as written, each
// in an empty temporary directory, then a small program that takes a lock
// with the installed library through a real broker and Consul agent: the
// installs a newcomer copies keep working on a fresh Debian 12 machine.
// The only change to a block: the repository's root in place of
// /path/to/lockbroker.
package install_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/readme"
)

// placeholder is the README's name for a checkout of the repository.
const placeholder = "/path/to/lockbroker"

// stepTimeout bounds each step (an install fetches from the npm registry
// or the Go module proxy, the Java build may compile the library).
const stepTimeout = 5 * time.Minute

// granted is what every program prints once it holds its lock.
var granted = regexp.MustCompile(`(?m)^token [1-9][0-9]*$`)

func TestInstall(t *testing.T) {
	b := brokertest.StartDev(t)
	root := brokertest.RepoRoot(t)

	t.Run("Python", func(t *testing.T) {
		dir := t.TempDir()
		// Debian's python3 (a python3 earlier on PATH may not see Debian's
		// grpcio), and nothing from PyPI: the README says pip fetches
		// nothing.
		env := append(withoutPip(os.Environ()), "PATH=/usr/bin:"+os.Getenv("PATH"), "PIP_NO_INDEX=1")
		runBlock(t, dir, env, root, "install-python")
		write(t, dir, "app.py", `import sys
import lockbroker

print("module", lockbroker.__file__)
client = lockbroker.Client(sys.argv[1])
with client.lock("install/python", ttl=15, wait=10, value=b"install") as lease:
    print("token", lease.token)
client.close()
`)
		out := run(t, dir, env, ".venv/bin/python", "app.py", b.Addr)
		assert.Regexp(t, granted, out)
		assert.Contains(t, out, "module "+filepath.Join(dir, ".venv"), "not the venv's lockbroker")
	})

	t.Run("Node", func(t *testing.T) {
		dir := t.TempDir()
		env := os.Environ()
		runBlock(t, dir, env, root, "install-node")
		write(t, dir, "app.mjs", `import { Client } from "@lockbroker/client";

const client = new Client(process.argv[2]);
const lease = await client.lock("install/node", { ttl: 15, wait: 10, value: "install" });
try {
  console.log("token", String(lease.token));
} finally {
  await lease.release();
  await client.close();
}
`)
		assert.Regexp(t, granted, run(t, dir, env, "node", "app.mjs", b.Addr))

		// The README: TypeScript compiles await using for Node 20 (with
		// client/node's TypeScript and @types/node).
		tsc := filepath.Join(root, "client", "node", "node_modules", ".bin", "tsc")
		write(t, dir, "using.mts", `import { Client } from "@lockbroker/client";

async function main(addr: string): Promise<void> {
  await using client = new Client(addr);
  await using lease = await client.lock("install/node-ts", { ttl: 15, wait: 10 });
  console.log("token", String(lease.token));
}
await main(process.argv[2]);
`)
		run(t, dir, env, tsc, "--target", "ES2022", "--lib", "ES2022,ESNext.Disposable",
			"--module", "NodeNext", "--moduleResolution", "NodeNext", "--skipLibCheck",
			"--typeRoots", filepath.Join(root, "client", "node", "node_modules", "@types"), "--types", "node", "using.mts")
		assert.Regexp(t, granted, run(t, dir, env, "node", "using.mjs", b.Addr))
	})

	t.Run("Go", func(t *testing.T) {
		dir := t.TempDir()
		env := append(os.Environ(), "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
		run(t, dir, env, "go", "mod", "init", "example.com/app")
		write(t, dir, "main.go", `package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lockbroker/lockbroker/client"
)

func main() {
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := client.New(conn).Lock(ctx, "install/go", client.WithTTL(15*time.Second))
	if err != nil {
		panic(err)
	}
	defer lease.Release(context.WithoutCancel(ctx))
	fmt.Println("token", lease.Sequencer().GetToken())
}
`)
		runBlock(t, dir, env, root, "install-go")
		assert.Regexp(t, granted, run(t, dir, env, "go", "run", ".", b.Addr))
	})

	t.Run("Java", func(t *testing.T) {
		dir := t.TempDir()
		write(t, dir, "Main.java", `import io.lockbroker.client.Lease;
import io.lockbroker.client.LockClient;
import io.lockbroker.client.LockOptions;
import java.time.Duration;

public class Main {
  public static void main(String[] args) throws Exception {
    try (LockClient client = LockClient.builder().target(System.getenv("LOCKBROKER_ADDR")).build();
         Lease lease = client.lock("install/java", LockOptions.defaults().ttl(Duration.ofSeconds(15)))) {
      System.out.println("token " + lease.token());
    }
  }
}
`)
		env := append(os.Environ(), "LOCKBROKER_ADDR="+b.Addr)
		assert.Regexp(t, granted, runBlock(t, dir, env, root, "install-java"))
	})
}

// runBlock runs the README block name with `sh -e` in dir, the repository
// root in place of the placeholder, and returns its output.
func runBlock(t *testing.T, dir string, env []string, root, name string) string {
	t.Helper()
	block := readme.Block(t, name)
	return run(t, dir, env, "sh", "-ec", strings.ReplaceAll(block, placeholder, root))
}

// run runs a command in dir to completion (at most stepTimeout) and
// returns its combined output; it fails t when the command fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Logf("$ %s %s\n%s", name, strings.Join(args, " "), out.String())
		require.NoError(t, err, "%s %s", name, strings.Join(args, " "))
	case <-time.After(stepTimeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s %s: still running after %s\n%s", name, strings.Join(args, " "), stepTimeout, out.String())
	}
	return out.String()
}

// write creates dir/name with text.
func write(t *testing.T, dir, name, text string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
}

// withoutPip drops pip's PIP_* settings from env, as on a fresh machine.
func withoutPip(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PIP_") {
			out = append(out, kv)
		}
	}
	return out
}

// Package buildinfo says which build of lockbroker is running: the
// version, the VCS revision it was built from and the Go version, for
// `broker --version`, `lockctl --version`, the broker's start-up log line
// and its lockbroker_build_info metric.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// version is set at link time by a release build:
//
//	go build -ldflags "-X github.com/lockbroker/lockbroker/internal/buildinfo.version=v1.2.3" ./cmd/broker
//
// Without it, Version falls back on what the Go toolchain recorded.
// revision is the VCS revision, set the same way (the Makefile sets both),
// for builds where the toolchain records none (-buildvcs=false, a git
// worktree, a source tree without .git).
var version, revision string

// Info is what a binary knows about its own build.
type Info struct {
	// Version is the -ldflags version, else the main module's version as
	// the Go toolchain recorded it (a tag, or a pseudo-version from the
	// VCS revision, "+dirty" with uncommitted changes), else "devel".
	Version string
	// Revision is the VCS revision the binary was built from ("" when
	// unknown), with "-dirty" when the tree had uncommitted changes.
	Revision string
	// GoVersion is the Go toolchain that built it.
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return fromBuildInfo(version, revision, bi)
}

// fromBuildInfo is Read given the -ldflags version and revision and the
// toolchain's record (nil when there is none). The toolchain's revision
// wins over the -ldflags one.
func fromBuildInfo(ldVersion, ldRevision string, bi *debug.BuildInfo) Info {
	info := Info{Version: ldVersion, Revision: ldRevision}
	if bi == nil {
		if info.Version == "" {
			info.Version = "devel"
		}
		return info
	}
	info.GoVersion = bi.GoVersion
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		info.Revision = rev
		if dirty {
			info.Revision += "-dirty"
		}
	}
	if info.Version == "" {
		info.Version = bi.Main.Version
	}
	if info.Version == "" || info.Version == "(devel)" {
		info.Version = "devel"
	}
	return info
}

// String is the one line --version prints after the program's name:
// "v1.2.3 (revision 0123abc..., go1.26.8)".
func (i Info) String() string {
	rev := i.Revision
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, rev, i.GoVersion)
}

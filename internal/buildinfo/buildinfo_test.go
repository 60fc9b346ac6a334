package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFromBuildInfo(t *testing.T) {
	rec := func(version string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: version}, Settings: settings}
	}
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "abc123"}
	tests := []struct {
		name    string
		ldflags string
		ldRev   string
		bi      *debug.BuildInfo
		want    Info
	}{
		{"nothing recorded", "", "", nil, Info{Version: "devel"}},
		{"ldflags only", "v1.2.3", "def456", nil, Info{Version: "v1.2.3", Revision: "def456"}},
		{"ldflags version wins", "v1.2.3", "", rec("v0.0.0-2026-abc123", rev), Info{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}},
		{"recorded revision wins", "v1.2.3", "def456", rec("(devel)", rev), Info{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}},
		{"ldflags revision without vcs", "v1.2.3", "def456", rec("(devel)"), Info{Version: "v1.2.3", Revision: "def456", GoVersion: "go1.26.8"}},
		{"pseudo-version", "", "", rec("v0.0.0-20261128-abc123", rev), Info{Version: "v0.0.0-20261128-abc123", Revision: "abc123", GoVersion: "go1.26.8"}},
		{"devel", "", "", rec("(devel)"), Info{Version: "devel", GoVersion: "go1.26.8"}},
		{"dirty", "", "", rec("v0.0.0-x+dirty", debug.BuildSetting{Key: "vcs.modified", Value: "true"}, rev),
			Info{Version: "v0.0.0-x+dirty", Revision: "abc123-dirty", GoVersion: "go1.26.8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, fromBuildInfo(tt.ldflags, tt.ldRev, tt.bi))
		})
	}
	assert.Equal(t, "v1.2.3 (revision abc123, go1.26.8)", Info{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"}.String())
	assert.Equal(t, "devel (revision unknown, )", Info{Version: "devel"}.String())
}

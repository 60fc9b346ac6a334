package readme

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	text := "intro\n<!-- test: a -->\n```sh\nx \\\n  y\n\n# c\nz\n```\n<!-- test: b -->\n```\n```\n"
	blocks, err := parse(text)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "x \\\n  y\n\n# c\nz\n", "b": "\n"}, blocks)
	assert.Equal(t, []string{"x   y", "z"}, Commands(blocks["a"]))

	tests := []struct{ name, text string }{
		{"duplicate", "<!-- test: a -->\n```\n```\n<!-- test: a -->\n```\n```\n"},
		{"no fence", "<!-- test: a -->\ntext\n"},
		{"unclosed", "<!-- test: a -->\n```\nx\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(tt.text)
			assert.Error(t, err)
		})
	}
}

package redis

import (
	"slices"
	"testing"
)

// TestNotice: a notification names exactly the sessions it was made of,
// whatever bytes their ids hold.
func TestNotice(t *testing.T) {
	t.Parallel()
	for _, ids := range [][]string{
		{"s"},
		{"a", "b", "c"},
		{"tenant\x1fs", "}{", "", "with space", "\x00\xff", string(make([]byte, 300))},
	} {
		if got := noticed(notice(ids)); !slices.Equal(got, ids) {
			t.Errorf("noticed(notice(%q)) = %q", ids, got)
		}
	}
	if got := noticed(""); len(got) != 0 {
		t.Errorf("noticed of an empty message: %q", got)
	}
	// A message cut short names what it holds whole, and no more.
	msg := notice([]string{"first", "second"})
	if got := noticed(msg[:len(msg)-2]); !slices.Equal(got, []string{"first"}) {
		t.Errorf("noticed of a cut message: %q", got)
	}
}

package console

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/store"
)

// TestShortenMessagesBoundsThePage: a message of megabytes is cut to
// maxShownMessageBytes at a rune boundary and says how much was left out;
// a short one is untouched.
func TestShortenMessagesBoundsThePage(t *testing.T) {
	long := strings.Repeat("é", 1<<20) // 2 MiB, two bytes a rune
	turns := []store.Turn{{Messages: []store.TranscriptMessage{{Role: "user", Content: "hi"}, {Index: 1, Role: "assistant", Content: long}}}}
	shortenMessages(turns)
	if got := turns[0].Messages[0].Content; got != "hi" {
		t.Fatalf("short message changed: %q", got)
	}
	got := turns[0].Messages[1].Content
	if len(got) > maxShownMessageBytes+200 || !utf8.ValidString(got) {
		t.Fatalf("shortened to %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	if !strings.Contains(got, "more bytes") || !strings.Contains(got, "/transcript") {
		t.Fatalf("the cut does not say what was left out: %q", got[len(got)-150:])
	}
}

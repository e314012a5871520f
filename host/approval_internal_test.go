package host

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// TestApprovalWaitFitsTheWaitLimits: what an approval wait shows of a
// long URL or a large request stays within a wait's limits (1,000 bytes of
// "for", 64 KiB of data), cut on rune boundaries, so that a hold is never
// refused as invalid.
func TestApprovalWaitFitsTheWaitLimits(t *testing.T) {
	long := "approve GET https://x.example/" + strings.Repeat("é", 2000)
	if c := clip(long, 1000); len(c) > 1000 || !utf8.ValidString(c) || !strings.HasSuffix(c, "…") {
		t.Errorf("clip: %d bytes, valid %v", len(c), utf8.ValidString(c))
	}
	if c := clip("short", 1000); c != "short" {
		t.Errorf("clip(short) = %q", c)
	}
	big := &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: "POST", URL: "https://x.example/",
		Headers: map[string]string{"Authorization": "Bearer {{secret:T}}"}, Body: make([]byte, 1<<20)}}
	d := approvalData(big)
	var shown abi.CallRequest
	if err := json.Unmarshal(d, &shown); err != nil || len(d) > 64<<10 || shown.HTTP.Body != nil || shown.HTTP.Headers["Authorization"] != "Bearer {{secret:T}}" {
		t.Errorf("approval data of a 1 MiB body: %d bytes, %v", len(d), err)
	}
	w := &store.WaitParams{ID: "approval-1-2", For: clip(long, 1000), Data: d, CallSeq: 2, CallDigest: "sha256:x"}
	if err := store.CheckWait(w); err != nil {
		t.Errorf("the hold's wait is refused: %v", err)
	}
}

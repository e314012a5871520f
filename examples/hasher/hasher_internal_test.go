package hasher

import "testing"

// TestProducersJobsTakeTheFastPath checks that the job data paddock bench
// and the peers' producers send is read without encoding/json (the point
// of plainJob), and that the text fastjson would misread is not.
func TestProducersJobsTakeTheFastPath(t *testing.T) {
	var jp jobParser
	for _, data := range []string{`{"idx":7,"key":"k00007","seq":3,"t":1764490000000000000}`,
		`{"idx":0,"key":"k00000","seq":0,"t":-1}`, `{"key":"k","seq":1}`, ` {"key":"é"} `} {
		if _, ok := plainJob(&jp, []byte(data)); !ok {
			t.Errorf("plainJob(%s): not taken", data)
		}
	}
	for _, data := range []string{`{"seq":01}`, `{"seq":inf}`, `{"seq":1-2}`, "{\"key\":\"a\tb\"}", `{"key":"\q"}`,
		`{"KEY":"k"}`, `{"key":"a","key":"b"}`, `{"key":"a","x":1}`, `null`, "{\"key\":\"\xff\"}", `{"t":1.0}`} {
		if j, ok := plainJob(&jp, []byte(data)); ok {
			t.Errorf("plainJob(%s) = %+v: taken, want json.Unmarshal's answer", data, j)
		}
	}
}

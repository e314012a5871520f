package abi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/paddock-dev/paddock/abi"
)

const schemaFile = "v1.schema.json"

// schemaDoc is the schema decoded as plain JSON, for structural checks.
type schemaDoc struct {
	Defs map[string]struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	} `json:"$defs"`
}

func readSchemaDoc(t *testing.T) schemaDoc {
	t.Helper()
	b, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	var d schemaDoc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
	return d
}

// compileSchema compiles the schema (which checks it against the draft
// 2020-12 meta-schema) and returns the validator of one $defs entry.
func compileSchema(t testing.TB, def string) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.AssertContent()
	if err := c.AddResource(schemaFile, doc); err != nil {
		t.Fatal(err)
	}
	loc := schemaFile
	if def != "" {
		loc += "#/$defs/" + def
	}
	s, err := c.Compile(loc)
	if err != nil {
		t.Fatalf("compile %s: %v", loc, err)
	}
	return s
}

func validate(t testing.TB, s *jsonschema.Schema, encoded []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(encoded))
	if err != nil {
		t.Fatalf("decode %s: %v", encoded, err)
	}
	return s.Validate(v)
}

// jsonFields returns the JSON names of a struct type's fields and which of
// them carry omitempty.
func jsonFields(t reflect.Type) (names []string, optional map[string]bool) {
	optional = map[string]bool{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		if slices.Contains(strings.Split(opts, ","), "omitempty") {
			optional[name] = true
		}
	}
	sort.Strings(names)
	return names, optional
}

// TestSchemaMatchesGoTypes: every JSON field of the Go contract types is a
// property of the matching $defs entry and vice versa; what Go always
// encodes in a request is required, what Go may omit is not.
func TestSchemaMatchesGoTypes(t *testing.T) {
	doc := readSchemaDoc(t)
	types := map[string]reflect.Type{
		"TurnRequest": reflect.TypeFor[abi.TurnRequest](),
		"TurnResult":  reflect.TypeFor[abi.TurnResult](),
		"TurnRef":     reflect.TypeFor[abi.TurnRef](),
		"Session":     reflect.TypeFor[abi.Session](),
		"Event":       reflect.TypeFor[abi.Event](),
		"Message":     reflect.TypeFor[abi.Message](),
		"Steer":       reflect.TypeFor[abi.Steer](),
		"AlarmOp":     reflect.TypeFor[abi.AlarmOp](),
		"AlarmFired":  reflect.TypeFor[abi.AlarmFired](),
		// Host calls.
		"CallRequest":   reflect.TypeFor[abi.CallRequest](),
		"HTTPRequest":   reflect.TypeFor[abi.HTTPRequest](),
		"ModelRequest":  reflect.TypeFor[abi.ModelRequest](),
		"ModelMessage":  reflect.TypeFor[abi.ModelMessage](),
		"ToolCall":      reflect.TypeFor[abi.ToolCall](),
		"ModelTool":     reflect.TypeFor[abi.ModelTool](),
		"CallResult":    reflect.TypeFor[abi.CallResult](),
		"HTTPResponse":  reflect.TypeFor[abi.HTTPResponse](),
		"ModelResponse": reflect.TypeFor[abi.ModelResponse](),
		"Usage":         reflect.TypeFor[abi.Usage](),
		"CallError":     reflect.TypeFor[abi.CallError](),
		// Streaming and waits.
		"Chunk":     reflect.TypeFor[abi.Chunk](),
		"WaitSpec":  reflect.TypeFor[abi.WaitSpec](),
		"WaitEvent": reflect.TypeFor[abi.WaitEvent](),
	}
	var defs []string
	for name := range doc.Defs {
		defs = append(defs, name)
	}
	sort.Strings(defs)
	var want []string
	for name := range types {
		want = append(want, name)
	}
	sort.Strings(want)
	if !slices.Equal(defs, want) {
		t.Fatalf("$defs are %v, Go contract types are %v", defs, want)
	}
	for name, typ := range types {
		def := doc.Defs[name]
		goNames, optional := jsonFields(typ)
		var props []string
		for p := range def.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		if !slices.Equal(goNames, props) {
			t.Errorf("%s: Go JSON fields %v, schema properties %v", name, goNames, props)
		}
		for _, r := range def.Required {
			if optional[r] {
				t.Errorf("%s: %q is required by the schema but omitempty in Go", name, r)
			}
			if !slices.Contains(goNames, r) {
				t.Errorf("%s: required %q is not a Go field", name, r)
			}
		}
		// Results may come from any language and may omit what null
		// means anyway (messages, state); everything else Go always
		// writes is required.
		if name == "TurnResult" {
			continue
		}
		for _, f := range goNames {
			if !optional[f] && !slices.Contains(def.Required, f) {
				t.Errorf("%s: %q is always encoded by Go but not required by the schema", name, f)
			}
		}
	}
}

// TestSchemaMatchesGoConstants: enums, the version and the limits in the
// schema are the Go constants.
func TestSchemaMatchesGoConstants(t *testing.T) {
	doc := readSchemaDoc(t)
	prop := func(def, p string) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(doc.Defs[def].Properties[p], &m); err != nil {
			t.Fatalf("%s.%s: %v", def, p, err)
		}
		return m
	}
	enum := func(m map[string]any) []string {
		var out []string
		for _, v := range m["enum"].([]any) {
			out = append(out, v.(string))
		}
		sort.Strings(out)
		return out
	}
	outcomes := []string{string(abi.OutcomeError), string(abi.OutcomeFinish), string(abi.OutcomeOK), string(abi.OutcomeSleep), string(abi.OutcomeWait)}
	if got := enum(prop("TurnResult", "outcome")); !slices.Equal(got, outcomes) {
		t.Errorf("outcome enum %v, Go outcomes %v", got, outcomes)
	}
	for _, o := range outcomes {
		if !abi.Outcome(o).Valid() {
			t.Errorf("Outcome(%q).Valid() = false", o)
		}
	}
	roles := []string{abi.RoleAssistant, abi.RoleSystem, abi.RoleTool, abi.RoleUser}
	if got := enum(prop("Message", "role")); !slices.Equal(got, roles) {
		t.Errorf("role enum %v, Go roles %v", got, roles)
	}
	if got := enum(prop("ModelMessage", "role")); !slices.Equal(got, roles) {
		t.Errorf("model message role enum %v, Go roles %v", got, roles)
	}
	kinds := []string{string(abi.CallKindEmit), string(abi.CallKindHTTP), string(abi.CallKindModel)}
	if got := enum(prop("CallRequest", "kind")); !slices.Equal(got, kinds) {
		t.Errorf("call kind enum %v, Go kinds %v", got, kinds)
	}
	codes := []string{string(abi.CallCancelled), string(abi.CallDenied), string(abi.CallInvalid), string(abi.CallNotConfigured),
		string(abi.CallTimeout), string(abi.CallTooLarge), string(abi.CallUpstream)}
	if got := enum(prop("CallError", "code")); !slices.Equal(got, codes) {
		t.Errorf("call error code enum %v, Go codes %v", got, codes)
	}
	if got := prop("TurnRequest", "abi_version")["const"]; got != float64(abi.Version) {
		t.Errorf("abi_version const %v, abi.Version %d", got, abi.Version)
	}
	if got := prop("TurnResult", "messages")["maxItems"]; got != float64(abi.MaxMessages) {
		t.Errorf("messages maxItems %v, abi.MaxMessages %d", got, abi.MaxMessages)
	}
	if got := prop("TurnResult", "alarms")["maxItems"]; got != float64(abi.MaxAlarmOps) {
		t.Errorf("alarms maxItems %v, abi.MaxAlarmOps %d", got, abi.MaxAlarmOps)
	}
	if got := prop("AlarmOp", "every_ms")["minimum"]; got != float64(abi.MinAlarmPeriodMs) {
		t.Errorf("every_ms minimum %v, abi.MinAlarmPeriodMs %d", got, abi.MinAlarmPeriodMs)
	}
	for _, p := range []string{"in_ms", "every_ms"} {
		if got := prop("AlarmOp", p)["maximum"]; got != float64(abi.MaxAlarmDelayMs) {
			t.Errorf("%s maximum %v, abi.MaxAlarmDelayMs %d", p, got, int64(abi.MaxAlarmDelayMs))
		}
	}
	chunkTypes := []string{abi.ChunkJSON, abi.ChunkText, abi.ChunkTool}
	if got := enum(prop("Chunk", "type")); !slices.Equal(got, chunkTypes) {
		t.Errorf("chunk type enum %v, Go chunk types %v", got, chunkTypes)
	}
	if got := prop("WaitSpec", "timeout_ms")["maximum"]; got != float64(abi.MaxAlarmDelayMs) {
		t.Errorf("wait timeout_ms maximum %v, abi.MaxAlarmDelayMs %d", got, int64(abi.MaxAlarmDelayMs))
	}
	stateLen := float64(base64.StdEncoding.EncodedLen(abi.MaxStateBytes))
	for _, def := range []string{"TurnRequest", "TurnResult"} {
		if got := prop(def, "state")["maxLength"]; got != stateLen {
			t.Errorf("%s.state maxLength %v, base64 of abi.MaxStateBytes is %v", def, got, stateLen)
		}
	}
}

func sampleRef() abi.TurnRef {
	return abi.TurnRef{DeliveryID: "dlv_1", ActivationUID: "act_1", ActorEpoch: 3, ActorEventID: 41,
		Revision: 1, AgentUID: "agt_1", SessionID: "ses_1"}
}

// steeredRef is sampleRef superseded by a steer: a new delivery, the next
// revision.
func steeredRef() abi.TurnRef {
	r := sampleRef()
	r.DeliveryID, r.Revision = "dlv_2", 2
	return r
}

// TestSchemaValidatesGoEncodings: what the Go types encode validates, for
// every shape the host and the SDKs produce.
func TestSchemaValidatesGoEncodings(t *testing.T) {
	reqSchema := compileSchema(t, "TurnRequest")
	resSchema := compileSchema(t, "TurnResult")
	root := compileSchema(t, "")
	at := time.Date(2026, 11, 30, 3, 0, 0, 123456789, time.UTC)
	requests := map[string]*abi.TurnRequest{
		"new session": {ABIVersion: abi.Version, TurnRef: sampleRef(),
			Session: abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event:   abi.Event{ID: 41, Kind: abi.EventMessage, AcceptedAt: at}, Attempt: 1},
		"full": {ABIVersion: abi.Version, TurnRef: sampleRef(),
			Session:    abi.Session{AgentName: "notes", SessionID: "ses_1", Key: "k", Input: []byte{0, 1, 2}},
			Event:      abi.Event{ID: 41, Kind: abi.EventMessage, Message: "hi", Data: json.RawMessage(`{"a":[1,2]}`), AcceptedAt: at},
			State:      []byte(`{"notes":[]}`),
			Transcript: []abi.Message{{Role: abi.RoleUser, Content: "hi"}, {Role: abi.RoleAssistant, Content: "hello"}},
			Attempt:    2},
		"alarm event with steers": {ABIVersion: abi.Version, TurnRef: steeredRef(),
			Session: abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event: abi.Event{ID: 41, Kind: abi.EventAlarm, AcceptedAt: at,
				Alarm: &abi.AlarmFired{Name: "remind-1", DueAt: at, Data: json.RawMessage(`{"text":"tea"}`)}},
			Attempt: 1,
			Steers:  []abi.Steer{{TurnRef: steeredRef(), EventID: 42, Message: "louder", Data: json.RawMessage(`[1]`)}}},
		"wait resolved": {ABIVersion: abi.Version, TurnRef: sampleRef(),
			Session: abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event: abi.Event{ID: 41, Kind: abi.EventWaitResolved, AcceptedAt: at,
				Wait: &abi.WaitEvent{ID: "w40", For: "a date", Data: json.RawMessage(`{"date":"2026-12-24"}`)}}, Attempt: 1},
		"wait expired": {ABIVersion: abi.Version, TurnRef: sampleRef(),
			Session: abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event:   abi.Event{ID: 41, Kind: abi.EventWaitExpired, AcceptedAt: at, Wait: &abi.WaitEvent{ID: "w40"}}, Attempt: 1},
		"empty state": {ABIVersion: abi.Version, TurnRef: sampleRef(),
			Session: abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event:   abi.Event{ID: 41, Kind: abi.EventMessage, AcceptedAt: at}, State: []byte{}, Transcript: []abi.Message{}, Attempt: 1},
	}
	for name, req := range requests {
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(t, reqSchema, b); err != nil {
			t.Errorf("request %q %s: %v", name, b, err)
		}
		if err := validate(t, root, b); err != nil {
			t.Errorf("request %q against the root schema: %v", name, err)
		}
	}
	results := map[string]*abi.TurnResult{
		"ok":    {TurnRef: sampleRef(), Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "hi"}}, State: []byte("s"), Outcome: abi.OutcomeOK},
		"keep":  {TurnRef: sampleRef(), Outcome: abi.OutcomeSleep},
		"clear": {TurnRef: sampleRef(), State: []byte{}, Outcome: abi.OutcomeFinish},
		"error": {TurnRef: sampleRef(), Outcome: abi.OutcomeError, Error: "boom"},
		"alarms": {TurnRef: sampleRef(), Outcome: abi.OutcomeOK, Alarms: []abi.AlarmOp{
			{Name: "once", InMs: 1500, Data: json.RawMessage(`{"text":"tea"}`)},
			{Name: "daily", At: &at, EveryMs: 86_400_000},
			{Name: "tick", InMs: 1000, EveryMs: abi.MinAlarmPeriodMs},
			{Name: "old", Clear: true},
		}},
		"wait": {TurnRef: sampleRef(), Outcome: abi.OutcomeWait, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "Which date?"}},
			Wait: &abi.WaitSpec{ID: "date-1", For: "a date", Data: json.RawMessage(`{"choices":["mon","tue"]}`), TimeoutMs: 86_400_000}},
		"wait unnamed": {TurnRef: sampleRef(), Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{}},
		"normal":       abi.Run(t.Context(), func(context.Context, *abi.TurnRequest) (*abi.TurnResult, error) { return &abi.TurnResult{}, nil }, requests["full"]),
	}
	for name, res := range results {
		if err := res.Validate(); err != nil {
			t.Fatalf("result %q is not a valid Go result: %v", name, err)
		}
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(t, resSchema, b); err != nil {
			t.Errorf("result %q %s: %v", name, b, err)
		}
		if err := validate(t, root, b); err != nil {
			t.Errorf("result %q against the root schema: %v", name, err)
		}
	}
}

// TestSchemaRejectsInvalid: the schema is not vacuous; each sample breaks
// one rule.
func TestSchemaRejectsInvalid(t *testing.T) {
	reqSchema := compileSchema(t, "TurnRequest")
	resSchema := compileSchema(t, "TurnResult")
	ref := `{"delivery_id":"d","activation_uid":"a","actor_epoch":1,"actor_event_id":2,"revision":0,"agent_uid":"g","session_id":"s"}`
	event := `{"id":2,"kind":"message","accepted_at":"2026-11-30T03:00:00Z"}`
	session := `{"agent_name":"n","session_id":"s"}`
	request := func(abiVersion, state, attempt string) string {
		return `{"abi_version":` + abiVersion + `,"turn_ref":` + ref + `,"session":` + session + `,"event":` + event +
			`,"state":` + state + `,"transcript":null,"attempt":` + attempt + `}`
	}
	if err := validate(t, reqSchema, []byte(request("1", "null", "1"))); err != nil {
		t.Fatalf("baseline request: %v", err)
	}
	for name, body := range map[string]string{
		"abi_version 2":             request("2", "null", "1"),
		"attempt 0":                 request("1", "null", "0"),
		"state not b64":             request("1", `"%%%"`, "1"),
		"state a number":            request("1", "7", "1"),
		"missing session":           `{"abi_version":1,"turn_ref":` + ref + `,"event":` + event + `,"state":null,"transcript":null,"attempt":1}`,
		"bad accepted_at":           strings.Replace(request("1", "null", "1"), "2026-11-30T03:00:00Z", "yesterday", 1),
		"alarm event without alarm": strings.Replace(request("1", "null", "1"), `"kind":"message"`, `"kind":"alarm"`, 1),
		"steer without ref":         strings.Replace(request("1", "null", "1"), `"attempt":1`, `"attempt":1,"steers":[{"event_id":3}]`, 1),
		"wait event without wait":   strings.Replace(request("1", "null", "1"), `"kind":"message"`, `"kind":"wait.resolved"`, 1),
		"expired without wait":      strings.Replace(request("1", "null", "1"), `"kind":"message"`, `"kind":"wait.expired"`, 1),
		"wait without id":           strings.Replace(request("1", "null", "1"), `"kind":"message"`, `"kind":"wait.resolved","wait":{"for":"x"}`, 1),
	} {
		if err := validate(t, reqSchema, []byte(body)); err == nil {
			t.Errorf("request %q validated: %s", name, body)
		}
	}
	if err := validate(t, resSchema, []byte(`{"turn_ref":`+ref+`,"outcome":"ok"}`)); err != nil {
		t.Fatalf("baseline result: %v", err)
	}
	alarms := func(ops string) string {
		return `{"turn_ref":` + ref + `,"outcome":"ok","alarms":[` + ops + `]}`
	}
	for _, ok := range []string{`{"name":"a","in_ms":5,"clear":false}`, `{"name":"a","clear":true}`, `{"name":"a","at":"2026-11-30T03:00:00Z","every_ms":1000,"data":null}`} {
		body := alarms(ok)
		if err := validate(t, resSchema, []byte(body)); err != nil {
			t.Errorf("alarm %s: %v", ok, err)
		}
		var res abi.TurnResult
		if err := json.Unmarshal([]byte(body), &res); err != nil || res.Validate() != nil {
			t.Errorf("alarm %s is not a valid Go result: %v, %v", ok, err, res.Validate())
		}
	}
	for name, body := range map[string]string{
		"no turn_ref":         `{"outcome":"ok"}`,
		"no outcome":          `{"turn_ref":` + ref + `}`,
		"unknown outcome":     `{"turn_ref":` + ref + `,"outcome":"done"}`,
		"error without text":  `{"turn_ref":` + ref + `,"outcome":"error"}`,
		"error empty text":    `{"turn_ref":` + ref + `,"outcome":"error","error":""}`,
		"bad role":            `{"turn_ref":` + ref + `,"outcome":"ok","messages":[{"role":"bot","content":"x"}]}`,
		"ref epoch a string":  `{"turn_ref":` + strings.Replace(ref, `"actor_epoch":1`, `"actor_epoch":"1"`, 1) + `,"outcome":"ok"}`,
		"alarm without when":  alarms(`{"name":"a"}`),
		"alarm in_ms and at":  alarms(`{"name":"a","in_ms":5,"at":"2026-11-30T03:00:00Z"}`),
		"alarm in_ms 0":       alarms(`{"name":"a","in_ms":0}`),
		"alarm clear false":   alarms(`{"name":"a","clear":false}`),
		"alarm set and clear": alarms(`{"name":"a","in_ms":5,"clear":true}`),
		"alarm clear every":   alarms(`{"name":"a","clear":true,"every_ms":1000}`),
		"alarm short period":  alarms(`{"name":"a","in_ms":5,"every_ms":999}`),
		"alarm no name":       alarms(`{"name":"","in_ms":5}`),
		"alarm bad at":        alarms(`{"name":"a","at":"tomorrow"}`),
		"wait without spec":   `{"turn_ref":` + ref + `,"outcome":"wait"}`,
		"spec without wait":   `{"turn_ref":` + ref + `,"outcome":"ok","wait":{"id":"w"}}`,
		"wait id with space":  `{"turn_ref":` + ref + `,"outcome":"wait","wait":{"id":"a b"}}`,
		"wait timeout < 0":    `{"turn_ref":` + ref + `,"outcome":"wait","wait":{"timeout_ms":-1}}`,
		"wait for too long":   `{"turn_ref":` + ref + `,"outcome":"wait","wait":{"for":"` + strings.Repeat("x", 1001) + `"}}`,
		"33 alarms":           alarms(strings.Repeat(`{"name":"a","clear":true},`, 32) + `{"name":"a","clear":true}`),
	} {
		if err := validate(t, resSchema, []byte(body)); err == nil {
			t.Errorf("result %q validated: %s", name, body)
		}
	}
}

// TestReadmeExamples: every JSON example in README.md validates against the
// schema and decodes into the Go types with the meaning the text gives it.
func TestReadmeExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) < 8 {
		t.Fatalf("README.md has %d json examples, want at least 8 (turns and host calls)", len(blocks))
	}
	root := compileSchema(t, "")
	for i, m := range blocks {
		body := m[1]
		if err := validate(t, root, body); err != nil {
			t.Errorf("README example %d: %v\n%s", i+1, err, body)
			continue
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Errorf("README example %d: %v", i+1, err)
			continue
		}
		switch {
		case top["abi_version"] != nil:
			var req abi.TurnRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("README example %d as TurnRequest: %v", i+1, err)
			}
			continue
		case top["kind"] != nil:
			var req abi.CallRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("README example %d as CallRequest: %v", i+1, err)
			} else if err := req.Validate(); err != nil {
				t.Errorf("README example %d: %v", i+1, err)
			}
			continue
		case top["seq"] != nil:
			var res abi.CallResult
			if err := json.Unmarshal(body, &res); err != nil {
				t.Errorf("README example %d as CallResult: %v", i+1, err)
			}
			continue
		}
		var res abi.TurnResult
		if err := json.Unmarshal(body, &res); err != nil {
			t.Errorf("README example %d as TurnResult: %v", i+1, err)
			continue
		}
		if err := res.Validate(); err != nil {
			t.Errorf("README example %d: %v", i+1, err)
		}
	}
}

func TestResultTextMustBeValidUTF8WithoutNUL(t *testing.T) {
	for _, c := range []string{"a\x00b", "\xff\xfe"} {
		r := &abi.TurnResult{Outcome: abi.OutcomeOK, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: c}}}
		if err := r.Validate(); !errors.Is(err, abi.ErrInvalidResult) {
			t.Errorf("content %q: Validate() = %v, want abi.ErrInvalidResult", c, err)
		}
	}
	ok := &abi.TurnResult{Outcome: abi.OutcomeOK, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "héllo ✓"}}}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid text refused: %v", err)
	}
}

// TestSchemaHostCalls: the host-call messages the Go types encode validate
// against their definitions and the root schema, and samples that break
// one rule each are refused.
func TestSchemaHostCalls(t *testing.T) {
	reqSchema := compileSchema(t, "CallRequest")
	resSchema := compileSchema(t, "CallResult")
	root := compileSchema(t, "")
	temp := 0.2
	requests := map[string]*abi.CallRequest{
		"http": {Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: "POST", URL: "https://api.example.com/x",
			Headers: map[string]string{"Authorization": "Bearer {{secret:TOKEN}}"}, Body: []byte{0, 1, 2}}},
		"http minimal": {Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{URL: "https://example.com"}},
		"model": {Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "main", Model: "m", MaxTokens: 100, Temperature: &temp,
			Stop: []string{"END"},
			Messages: []abi.ModelMessage{{Role: abi.RoleSystem, Content: "be brief"}, {Role: abi.RoleUser, Content: "hi"},
				{Role: abi.RoleAssistant, ToolCalls: []abi.ToolCall{{ID: "c1", Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}},
				{Role: abi.RoleTool, ToolCallID: "c1", Content: "42"}},
			Tools: []abi.ModelTool{{Name: "f", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`)}}}},
		"emit text":        {Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkText, Text: "Hel"}},
		"emit empty":       {Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkText}},
		"emit tool":        {Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkTool, Data: json.RawMessage(`{"tool":"search","status":"running"}`)}},
		"emit json":        {Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkJSON, Data: json.RawMessage(`[1,2]`)}},
		"emit model delta": {Kind: abi.CallKindEmit, Emit: &abi.Chunk{Type: abi.ChunkText, Text: "lo", CallSeq: 2}},
	}
	for name, req := range requests {
		if err := req.Validate(); err != nil {
			t.Fatalf("request %q is not valid in Go: %v", name, err)
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*jsonschema.Schema{reqSchema, root} {
			if err := validate(t, s, b); err != nil {
				t.Errorf("request %q %s: %v", name, b, err)
			}
		}
	}
	results := map[string]*abi.CallResult{
		"http": {Seq: 1, HTTP: &abi.HTTPResponse{Status: 404, Headers: map[string]string{"A": "b, c"}, Body: []byte("no")}},
		"model": {Seq: 2, Replayed: true, Model: &abi.ModelResponse{Message: abi.ModelMessage{Role: abi.RoleAssistant, Content: "hi"},
			StopReason: abi.StopEndTurn, Model: "m", Usage: abi.Usage{InputTokens: 3, OutputTokens: 1}}},
		"error":           {Seq: 3, Error: &abi.CallError{Code: abi.CallUpstream, Message: "bad gateway", Status: 502}},
		"no channel":      abi.NoCaller(),
		"emit accepted":   {},
		"approval denied": {Seq: 4, Error: &abi.CallError{Code: abi.CallDenied, Reason: "approval", Message: "not approved: too expensive"}},
	}
	for name, res := range results {
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*jsonschema.Schema{resSchema, root} {
			if err := validate(t, s, b); err != nil {
				t.Errorf("result %q %s: %v", name, b, err)
			}
		}
	}
	for name, body := range map[string]string{
		"unknown kind":           `{"kind":"ftp"}`,
		"http without http":      `{"kind":"http"}`,
		"http with model":        `{"kind":"http","http":{"url":"https://x"},"model":{"endpoint":"e","messages":[{"role":"user"}]}}`,
		"kind and field differ":  `{"kind":"model","http":{"url":"https://x"}}`,
		"http without url":       `{"kind":"http","http":{}}`,
		"header not a string":    `{"kind":"http","http":{"url":"https://x","headers":{"a":1}}}`,
		"body not base64":        `{"kind":"http","http":{"url":"https://x","body":"%%%"}}`,
		"model without messages": `{"kind":"model","model":{"endpoint":"e","messages":[]}}`,
		"bad role":               `{"kind":"model","model":{"endpoint":"e","messages":[{"role":"bot"}]}}`,
		"tool without id":        `{"kind":"model","model":{"endpoint":"e","messages":[{"role":"tool","content":"x"}]}}`,
		"tool without name":      `{"kind":"model","model":{"endpoint":"e","messages":[{"role":"user"}],"tools":[{"name":""}]}}`,
		"emit without emit":      `{"kind":"emit"}`,
		"emit with http":         `{"kind":"emit","emit":{"type":"text","text":"x"},"http":{"url":"https://x"}}`,
		"http with emit":         `{"kind":"http","http":{"url":"https://x"},"emit":{"type":"text","text":"x"}}`,
		"emit unknown type":      `{"kind":"emit","emit":{"type":"image"}}`,
		"emit text with data":    `{"kind":"emit","emit":{"type":"text","text":"x","data":1}}`,
		"emit tool without data": `{"kind":"emit","emit":{"type":"tool"}}`,
		"emit json with text":    `{"kind":"emit","emit":{"type":"json","text":"x","data":1}}`,
		"emit negative call_seq": `{"kind":"emit","emit":{"type":"text","call_seq":-1}}`,
	} {
		if err := validate(t, reqSchema, []byte(body)); err == nil {
			t.Errorf("request %q validated: %s", name, body)
		}
		// The schema and Validate agree on what a request is.
		var req abi.CallRequest
		if json.Unmarshal([]byte(body), &req) == nil && req.Validate() == nil && name != "header not a string" && name != "body not base64" {
			t.Errorf("request %q is valid in Go: %s", name, body)
		}
	}
	for name, body := range map[string]string{
		"no seq":            `{"http":{"status":200}}`,
		"nothing":           `{"seq":1}`,
		"http and error":    `{"seq":1,"http":{"status":200},"error":{"code":"denied","message":"x"}}`,
		"unknown code":      `{"seq":1,"error":{"code":"nope","message":"x"}}`,
		"error no message":  `{"seq":1,"error":{"code":"denied"}}`,
		"model no usage":    `{"seq":1,"model":{"message":{"role":"assistant"},"stop_reason":"end_turn"}}`,
		"negative seq":      `{"seq":-1,"http":{"status":200}}`,
		"replayed a string": `{"seq":1,"http":{"status":200},"replayed":"yes"}`,
		"empty with a seq":  `{"seq":3}`,
	} {
		if err := validate(t, resSchema, []byte(body)); err == nil {
			t.Errorf("result %q validated: %s", name, body)
		}
	}
}

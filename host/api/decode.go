package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/host/service"
)

// decode reads a JSON body strictly: size-limited, a JSON object, field
// names matched exactly (encoding/json alone would match them ignoring
// case), unknown fields refused, one value only.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	return s.decodeLimit(w, r, v, s.o.MaxBodyBytes)
}

// decodeLimit is decode with a body of at most limit bytes.
func (s *Server) decodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return jsonError(err, limit)
	}
	body := bytes.TrimSpace(raw)
	if len(body) == 0 {
		return badRequest("malformed_json", "", "the body is empty; a JSON object is required")
	}
	if at := service.InvalidUTF8At(raw); at < len(raw) {
		// encoding/json would store U+FFFD for each bad byte: what was
		// sent is not what would be kept. JSON text is UTF-8 (RFC 8259 8.1).
		return badRequest("malformed_json", "", "the body is not valid UTF-8 (at byte %d); JSON text must be UTF-8", at)
	}
	if body[0] != '{' {
		if err := json.Unmarshal(body, new(json.RawMessage)); err != nil {
			// Not JSON at all (text sent without its JSON wrapper): say so,
			// rather than guess a kind from the first byte.
			var syntaxErr *json.SyntaxError
			if errors.As(err, &syntaxErr) {
				return badRequest("malformed_json", "", "the body is not JSON (at byte %d: %s); a JSON object is required, such as {\"message\": \"hello\"}",
					syntaxErr.Offset, syntaxErr.Error())
			}
			return badRequest("malformed_json", "", "the body is not JSON; a JSON object is required")
		}
		return badRequest("malformed_json", "", "the body must be a JSON object, not %s", jsonKind(body[0]))
	}
	var fields map[string]json.RawMessage
	first := json.NewDecoder(bytes.NewReader(body))
	if err := first.Decode(&fields); err != nil {
		return jsonError(err, limit)
	}
	if _, err := first.Token(); err != io.EOF {
		return badRequest("malformed_json", "", "the body holds more than one JSON value")
	}
	allowed := jsonFields(v)
	for name := range fields {
		if !allowed[name] {
			return badRequest("unknown_field", name, "unknown field %q (fields: %s)", name, strings.Join(sortedKeys(allowed), ", "))
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, limit)
	}
	return nil
}

func jsonKind(b byte) string {
	switch b {
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

// jsonFields returns the JSON field names of the struct v points to.
func jsonFields(v any) map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func jsonError(err error, limit int64) error {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &maxErr):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Message: fmt.Sprintf("the body exceeds the limit of %d bytes", limit)}
	case errors.Is(err, io.EOF):
		return badRequest("malformed_json", "", "the body is empty; a JSON object is required")
	case errors.As(err, &syntaxErr):
		return badRequest("malformed_json", "", "malformed JSON at byte %d: %s", syntaxErr.Offset, syntaxErr.Error())
	case errors.As(err, &typeErr):
		return badRequest("invalid_field", typeErr.Field, "field %q must be %s, not JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("malformed_json", "", "malformed JSON: unexpected end of the body")
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return badRequest("unknown_field", f, "unknown field %q", f)
	}
	return badRequest("malformed_json", "", "malformed JSON: %s", err.Error())
}

// intParam parses the query parameter name: def when absent, else an
// integer between lo and hi (or invalid_parameter).
func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, badRequest("invalid_parameter", name, "%s=%q must be an integer between %d and %d", name, v, lo, hi)
	}
	return n, nil
}

// eventParam parses the {event} path value.
func eventParam(r *http.Request) (int64, error) {
	v := r.PathValue("event")
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("invalid_parameter", "event", "event %q must be a positive event id", v)
	}
	return id, nil
}

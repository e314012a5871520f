package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/paddock-dev/paddock/abi"
)

// AlarmWrites are a commit's alarm operations reduced to the writes a
// driver makes in the commit transaction.
type AlarmWrites struct {
	// Clear names the alarms to delete, sorted.
	Clear []string
	// Set are the alarms to upsert by name, sorted by name: due_at = At,
	// or DB now + InMs when At is nil; InMs and EveryMs are ≥ 0 (EveryMs 0:
	// one-shot); Data is nil for none (also for a JSON null).
	Set []abi.AlarmOp
}

// PlanAlarmOps reduces a commit's alarm operations: per name the last
// operation wins; negative InMs and EveryMs count as 0. Data that is not
// valid JSON is refused (it goes verbatim into the alarm event's JSON
// payload), wrapping ErrInvalid.
func PlanAlarmOps(ops []abi.AlarmOp) (AlarmWrites, error) {
	var w AlarmWrites
	if len(ops) == 0 {
		return w, nil
	}
	last := make(map[string]abi.AlarmOp, len(ops))
	for _, op := range ops {
		if !op.Clear && len(op.Data) > 0 && !json.Valid(op.Data) {
			return AlarmWrites{}, fmt.Errorf("alarm %q: data is not valid JSON: %w", op.Name, ErrInvalid)
		}
		last[op.Name] = op
	}
	for _, n := range slices.Sorted(maps.Keys(last)) {
		op := last[n]
		if op.Clear {
			w.Clear = append(w.Clear, n)
			continue
		}
		op.InMs, op.EveryMs = max(op.InMs, 0), max(op.EveryMs, 0)
		if string(op.Data) == "null" || len(op.Data) == 0 {
			op.Data = nil
		}
		w.Set = append(w.Set, op)
	}
	return w, nil
}

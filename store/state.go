package store

// Session state has three values a driver must keep apart (abi/README:
// the request's `state`): never set or removed (nil; the request carries
// `null`), set and empty ([]byte{}; the request carries `""`), and set to
// bytes. The column is NULL for the first and an empty blob for the
// second.

// StateColumn is the value a driver writes to session_state.state for a
// commit's CommitTurnParams.State (when not KeepState): nil (SQL NULL) for
// nil, otherwise the bytes, an empty slice staying an empty blob.
func StateColumn(state []byte) []byte {
	if state == nil {
		return nil
	}
	if len(state) == 0 {
		return []byte{}
	}
	return state
}

// StateFromColumn is the committed state read from session_state.state:
// nil when there is no row or the column is NULL (notNull false), else the
// bytes, non-nil even when empty ([]byte{}), whatever the driver's scan
// made of a zero-length blob.
func StateFromColumn(b []byte, notNull bool) []byte {
	if !notNull {
		return nil
	}
	if b == nil {
		return []byte{}
	}
	return b
}

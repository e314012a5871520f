package main

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Human output prints text that agents and users wrote (transcript
// messages, event errors, payloads, session keys). Printed raw, such text
// can drive the terminal (an OSC sequence sets its title, CSI 2J clears
// the screen) or forge the CLI's own lines (a message "ok\n── turn 99 …"
// reads as a turn header). The helpers below make it inert; --output json
// prints the server's values exactly and does not use them.

// contIndent starts the continuation lines of a multi-line text: the
// CLI's own lines (turn headers, table rows) start in column 0, so an
// indented line cannot pass for one of them.
const contIndent = "    "

// escapeRune reports whether r is shown as an escape rather than printed:
// C0 controls (but tab and newline, handled by the callers), DEL, C1
// controls and the bidirectional-text controls that reorder what is shown.
func escapeRune(r rune) bool {
	switch {
	case r < 0x20 && r != '\t' && r != '\n':
		return true
	case r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f,
		r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// escapeControls writes s to b with the runes of escapeRune and invalid
// UTF-8 bytes escaped Go-style (\x1b, \u009b, \u202e); a backslash is
// printed as it is. Tabs are kept unless escTab; newlines are the
// callers'.
func escapeControls(b *strings.Builder, s string, escTab bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(b, `\x%02x`, s[i])
		case r == '\t' && escTab:
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case escapeRune(r) && r < 0x80:
			fmt.Fprintf(b, `\x%02x`, r)
		case escapeRune(r):
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
}

// safeText returns agent- or user-written text s for a terminal:
// controls escaped (tab kept) and every line after the first indented by
// contIndent, so that the text cannot drive the terminal or look like a
// line of the CLI's own.
func safeText(s string) string {
	var b strings.Builder
	for i, line := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteString("\n" + contIndent)
		}
		escapeControls(&b, line, false)
	}
	return b.String()
}

// safeCell returns s for one cell of a table: controls escaped, tabs
// (which would shift the columns) and newlines shown as \t and \n.
func safeCell(s string) string {
	var b strings.Builder
	for i, line := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteString(`\n`)
		}
		escapeControls(&b, line, true)
	}
	return b.String()
}

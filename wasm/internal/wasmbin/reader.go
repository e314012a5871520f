// Package wasmbin reads the primitives of the WebAssembly binary format
// (core spec 5): the one reader of the module's header checks (package
// wasm) and of the fuel check's rewriter (internal/interrupt). Every read
// is bounds-checked; the first error sticks and later reads return zero
// values, so a caller checks Err once after a run of reads.
package wasmbin

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// ErrTruncated says a section, body or vector runs past its end.
var ErrTruncated = errors.New("unexpected end")

// Reader reads the binary format's primitives; the first error sticks and
// later reads return zero values.
type Reader struct {
	// B is what is left to read.
	B []byte
	// Err is the first error (wraps ErrTruncated when input ran out).
	Err error
}

func (r *Reader) Fail(err error) {
	if r.Err == nil {
		r.Err = err
	}
	r.B = nil
}

// end reports r's error, or an error when bytes are left.
func (r *Reader) End() error {
	if r.Err == nil && len(r.B) != 0 {
		return fmt.Errorf("%d bytes after the last entry", len(r.B))
	}
	return r.Err
}

func (r *Reader) Byte() byte {
	if len(r.B) == 0 {
		r.Fail(ErrTruncated)
		return 0
	}
	v := r.B[0]
	r.B = r.B[1:]
	return v
}

func (r *Reader) Bytes(n int) []byte {
	if n < 0 || n > len(r.B) {
		r.Fail(ErrTruncated)
		return nil
	}
	v := r.B[:n]
	r.B = r.B[n:]
	return v
}

// leb returns the length of the LEB128 number at the start of r (at most
// 10 bytes: any integer the format has).
func (r *Reader) LEB() int {
	for i := 0; i < len(r.B) && i < 10; i++ {
		if r.B[i]&0x80 == 0 {
			return i + 1
		}
	}
	r.Fail(errors.New("malformed LEB128 number"))
	return 0
}

// copyLEB appends the LEB128 number at the start of r to w unchanged.
func (r *Reader) CopyLEB(w []byte) []byte {
	n := r.LEB()
	return append(w, r.Bytes(n)...)
}

// u32 reads an unsigned LEB128 u32.
func (r *Reader) U32() uint32 {
	var v uint64
	for i := range 5 {
		b := r.Byte()
		if r.Err != nil {
			return 0
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			if v > 0xffffffff {
				r.Fail(errors.New("u32 out of range"))
				return 0
			}
			return uint32(v)
		}
	}
	r.Fail(errors.New("malformed u32"))
	return 0
}

func (r *Reader) Name() string {
	n := r.U32()
	b := r.Bytes(int(n))
	if r.Err == nil && !utf8.Valid(b) {
		r.Fail(errors.New("name is not UTF-8"))
	}
	return string(b)
}

// valtype skips a value type: a number, vector or reference type byte, or
// a reference type with a heap type (ref null ht, ref ht).
func (r *Reader) Valtype() {
	switch t := r.Byte(); t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
	case 0x63, 0x64:
		// wazero reads a heap type (an s33) as at most five bytes, the
		// fifth whatever its continuation bit: a longer read here would
		// put the next instruction elsewhere than wazero does.
		if n := r.LEB(); r.Err == nil && n > 4 {
			r.Fail(errors.New("heap type longer than four bytes"))
		} else {
			r.Bytes(n)
		}
	default:
		if r.Err == nil {
			r.Fail(fmt.Errorf("value type %#x", t))
		}
	}
}

// copyValtype appends the value type at the start of r to w.
func (r *Reader) CopyValtype(w []byte) []byte {
	start := r.B
	r.Valtype()
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

// limits skips table or memory limits (with max, shared, 64-bit).
func (r *Reader) Limits() {
	flags := r.Byte()
	if flags > 0x07 {
		r.Fail(fmt.Errorf("limits flags %#x", flags))
		return
	}
	r.Bytes(r.LEB())
	if flags&0x01 != 0 {
		r.Bytes(r.LEB())
	}
}

// copyBlockType copies the block type of block, loop or if: 0x40, a value
// type, or a type index (s33). A value type of one byte may be followed by
// a heap type (0x63 ref null ht, 0x64 ref ht), as wazero reads it. Only
// encodings wazero and this reader agree on are taken: one byte, or a
// non-negative index of at most four bytes (wazero reads the fifth byte of
// an s33 its own way); anything else is refused, since a block type read
// shorter or longer than wazero reads it would hide the instructions after
// it from the fuel check.
func (r *Reader) CopyBlockType(w []byte) []byte {
	start := r.B
	n := r.LEB()
	switch {
	case r.Err != nil:
	case n == 1 && (start[0] == 0x63 || start[0] == 0x64):
		r.Bytes(1)
		if h := r.LEB(); r.Err == nil && h > 4 {
			r.Fail(errors.New("heap type of a block type longer than four bytes"))
		} else {
			r.Bytes(h)
		}
	case n == 1:
		r.Bytes(1)
	case n > 4 || start[n-1]&0x40 != 0:
		r.Fail(errors.New("block type: not a one-byte type or a non-negative index of at most four bytes"))
	default:
		r.Bytes(n)
	}
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

// copyMemarg copies a memarg: align (bit 6: a memory index follows), then
// the offset.
func (r *Reader) CopyMemarg(w []byte) []byte {
	start := r.B
	align := r.U32()
	if align&0x40 != 0 {
		r.U32()
	}
	r.Bytes(r.LEB())
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

// copyPrefixFC copies a 0xfc instruction's sub-opcode and immediates:
// saturating truncations, bulk memory and table instructions.
func (r *Reader) CopyPrefixFC(w []byte) []byte {
	start := r.B
	sub := r.U32()
	switch {
	case sub <= 7: // trunc_sat
	case sub == 8: // memory.init data mem
		r.Bytes(r.LEB())
		r.Bytes(r.LEB())
	case sub == 9, sub == 13, sub == 15, sub == 16, sub == 17: // data.drop, elem.drop, table.grow/size/fill
		r.Bytes(r.LEB())
	case sub == 10, sub == 12, sub == 14: // memory.copy, table.init, table.copy
		r.Bytes(r.LEB())
		r.Bytes(r.LEB())
	case sub == 11: // memory.fill mem
		r.Bytes(r.LEB())
	default:
		r.Fail(fmt.Errorf("opcode 0xfc %d", sub))
	}
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

// copyPrefixFD copies a SIMD instruction (0xfd) and its immediates.
//
// The format encodes the sub-opcode as a LEB128 u32, but wazero (v1.12)
// reads it as one byte: a sub-opcode of 128-255 is two bytes, the second
// 0x01, which wazero then reads as a nop. Any other encoding (a larger
// sub-opcode, a non-minimal LEB128) would make the two readers disagree on
// where the next instruction starts, so that wazero could run a loop the
// fuel check never saw: it is refused.
func (r *Reader) CopyPrefixFD(w []byte) []byte {
	start := r.B
	sub := uint32(r.Byte())
	if sub >= 0x80 && r.Err == nil {
		if next := r.Byte(); r.Err == nil && next != 0x01 {
			r.Fail(fmt.Errorf("SIMD opcode 0xfd %#x %#x: not one wazero reads alike", sub, next))
		}
	}
	switch {
	case r.Err != nil:
	case sub <= 11, sub == 92, sub == 93: // loads and stores: memarg
		r.CopyMemarg(nil)
	case sub == 12, sub == 13: // v128.const, i8x16.shuffle
		r.Bytes(16)
	case sub >= 21 && sub <= 34: // extract and replace lane
		r.Bytes(1)
	case sub >= 84 && sub <= 91: // lane loads and stores: memarg, lane
		r.CopyMemarg(nil)
		r.Bytes(1)
	default: // the rest: no immediates
	}
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

// copyPrefixFE copies a threads instruction (0xfe): atomic.fence has a
// reserved byte, every other a memarg. wazero reads the sub-opcode as one
// byte, so only its one-byte encoding is taken (see copyPrefixFD).
func (r *Reader) CopyPrefixFE(w []byte) []byte {
	start := r.B
	sub := uint32(r.Byte())
	switch {
	case r.Err != nil:
	case sub == 3:
		r.Bytes(1)
	case sub <= 2, sub >= 0x10 && sub <= 0x4e:
		r.CopyMemarg(nil)
	default:
		r.Fail(fmt.Errorf("opcode 0xfe %d", sub))
	}
	if r.Err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.B)]...)
}

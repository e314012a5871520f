package interrupt

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// errTruncated says a section, body or vector runs past its end.
var errTruncated = errors.New("unexpected end")

// reader reads the binary format's primitives; the first error sticks and
// later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// end reports r's error, or an error when bytes are left.
func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		return fmt.Errorf("%d bytes after the last entry", len(r.b))
	}
	return r.err
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.fail(errTruncated)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail(errTruncated)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// leb returns the length of the LEB128 number at the start of r (at most
// 10 bytes: any integer the format has).
func (r *reader) leb() int {
	for i := 0; i < len(r.b) && i < 10; i++ {
		if r.b[i]&0x80 == 0 {
			return i + 1
		}
	}
	r.fail(errors.New("malformed LEB128 number"))
	return 0
}

// copyLEB appends the LEB128 number at the start of r to w unchanged.
func (r *reader) copyLEB(w []byte) []byte {
	n := r.leb()
	return append(w, r.bytes(n)...)
}

// u32 reads an unsigned LEB128 u32.
func (r *reader) u32() uint32 {
	var v uint64
	for i := range 5 {
		b := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(b&0x7f) << (7 * i)
		if b&0x80 == 0 {
			if v > 0xffffffff {
				r.fail(errors.New("u32 out of range"))
				return 0
			}
			return uint32(v)
		}
	}
	r.fail(errors.New("malformed u32"))
	return 0
}

func (r *reader) name() string {
	n := r.u32()
	b := r.bytes(int(n))
	if r.err == nil && !utf8.Valid(b) {
		r.fail(errors.New("name is not UTF-8"))
	}
	return string(b)
}

// valtype skips a value type: a number, vector or reference type byte, or
// a reference type with a heap type (ref null ht, ref ht).
func (r *reader) valtype() {
	switch t := r.byte(); t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
	case 0x63, 0x64:
		// wazero reads a heap type (an s33) as at most five bytes, the
		// fifth whatever its continuation bit: a longer read here would
		// put the next instruction elsewhere than wazero does.
		if n := r.leb(); r.err == nil && n > 4 {
			r.fail(errors.New("heap type longer than four bytes"))
		} else {
			r.bytes(n)
		}
	default:
		if r.err == nil {
			r.fail(fmt.Errorf("value type %#x", t))
		}
	}
}

// copyValtype appends the value type at the start of r to w.
func (r *reader) copyValtype(w []byte) []byte {
	start := r.b
	r.valtype()
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

// limits skips table or memory limits (with max, shared, 64-bit).
func (r *reader) limits() {
	flags := r.byte()
	if flags > 0x07 {
		r.fail(fmt.Errorf("limits flags %#x", flags))
		return
	}
	r.bytes(r.leb())
	if flags&0x01 != 0 {
		r.bytes(r.leb())
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
func (r *reader) copyBlockType(w []byte) []byte {
	start := r.b
	n := r.leb()
	switch {
	case r.err != nil:
	case n == 1 && (start[0] == 0x63 || start[0] == 0x64):
		r.bytes(1)
		if h := r.leb(); r.err == nil && h > 4 {
			r.fail(errors.New("heap type of a block type longer than four bytes"))
		} else {
			r.bytes(h)
		}
	case n == 1:
		r.bytes(1)
	case n > 4 || start[n-1]&0x40 != 0:
		r.fail(errors.New("block type: not a one-byte type or a non-negative index of at most four bytes"))
	default:
		r.bytes(n)
	}
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

// copyMemarg copies a memarg: align (bit 6: a memory index follows), then
// the offset.
func (r *reader) copyMemarg(w []byte) []byte {
	start := r.b
	align := r.u32()
	if align&0x40 != 0 {
		r.u32()
	}
	r.bytes(r.leb())
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

// copyPrefixFC copies a 0xfc instruction's sub-opcode and immediates:
// saturating truncations, bulk memory and table instructions.
func (r *reader) copyPrefixFC(w []byte) []byte {
	start := r.b
	sub := r.u32()
	switch {
	case sub <= 7: // trunc_sat
	case sub == 8: // memory.init data mem
		r.bytes(r.leb())
		r.bytes(r.leb())
	case sub == 9, sub == 13, sub == 15, sub == 16, sub == 17: // data.drop, elem.drop, table.grow/size/fill
		r.bytes(r.leb())
	case sub == 10, sub == 12, sub == 14: // memory.copy, table.init, table.copy
		r.bytes(r.leb())
		r.bytes(r.leb())
	case sub == 11: // memory.fill mem
		r.bytes(r.leb())
	default:
		r.fail(fmt.Errorf("opcode 0xfc %d", sub))
	}
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

// copyPrefixFD copies a SIMD instruction (0xfd) and its immediates.
//
// The format encodes the sub-opcode as a LEB128 u32, but wazero (v1.12)
// reads it as one byte: a sub-opcode of 128-255 is two bytes, the second
// 0x01, which wazero then reads as a nop. Any other encoding (a larger
// sub-opcode, a non-minimal LEB128) would make the two readers disagree on
// where the next instruction starts, so that wazero could run a loop the
// fuel check never saw: it is refused.
func (r *reader) copyPrefixFD(w []byte) []byte {
	start := r.b
	sub := uint32(r.byte())
	if sub >= 0x80 && r.err == nil {
		if next := r.byte(); r.err == nil && next != 0x01 {
			r.fail(fmt.Errorf("SIMD opcode 0xfd %#x %#x: not one wazero reads alike", sub, next))
		}
	}
	switch {
	case r.err != nil:
	case sub <= 11, sub == 92, sub == 93: // loads and stores: memarg
		r.copyMemarg(nil)
	case sub == 12, sub == 13: // v128.const, i8x16.shuffle
		r.bytes(16)
	case sub >= 21 && sub <= 34: // extract and replace lane
		r.bytes(1)
	case sub >= 84 && sub <= 91: // lane loads and stores: memarg, lane
		r.copyMemarg(nil)
		r.bytes(1)
	default: // the rest: no immediates
	}
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

// copyPrefixFE copies a threads instruction (0xfe): atomic.fence has a
// reserved byte, every other a memarg. wazero reads the sub-opcode as one
// byte, so only its one-byte encoding is taken (see copyPrefixFD).
func (r *reader) copyPrefixFE(w []byte) []byte {
	start := r.b
	sub := uint32(r.byte())
	switch {
	case r.err != nil:
	case sub == 3:
		r.bytes(1)
	case sub <= 2, sub >= 0x10 && sub <= 0x4e:
		r.copyMemarg(nil)
	default:
		r.fail(fmt.Errorf("opcode 0xfe %d", sub))
	}
	if r.err != nil {
		return w
	}
	return append(w, start[:len(start)-len(r.b)]...)
}

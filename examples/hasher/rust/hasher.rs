//! The bench agent of `paddock bench` (examples/hasher) in Rust: the same
//! unit of work, byte for byte — SHA-256 of a 1 KiB buffer derived from the
//! job's key and seq, answered as one assistant message with the first 8
//! bytes of the digest in hex — as a wasm reactor that implements the wasm
//! guest ABI (abi/README.md, "Wasm guest ABI") by hand, with the standard
//! library only: no SDK, no crates.
//!
//! It exists to show what a turn costs the host when the guest's code is
//! compiled well: Go's wasm code generation makes a turn of the Go hasher
//! cost the wasm worker about 90 µs (its request decoding, the job's
//! json.Unmarshal and the SHA-256), this module's about 25.
//! `paddock bench --module examples/hasher/hasher-rust.wasm` runs it, and
//! `make bench-peers` reports it beside the Go module.
//!
//! Build: `make rust-examples`, which runs Debian's rustc 1.63 (packages
//! rustc, libstd-rust-dev-wasm32 and lld):
//!
//! ```text
//! /usr/bin/rustc --edition 2021 --target wasm32-wasi --crate-type cdylib -C opt-level=3 \
//!     -C panic=abort -C strip=symbols -o examples/hasher/hasher-rust.wasm examples/hasher/rust/hasher.rs
//! ```
//!
//! Newer compilers call the target wasm32-wasip1 (`make rust-examples
//! RUSTC_WASM=rustc RUSTC_WASM_TARGET=wasm32-wasip1` with rustup's target
//! installed); the code needs nothing newer than Rust 1.63.
//!
//! JSON: the request is read by a small scanner that keeps what the agent
//! needs (the raw `turn_ref`, echoed unchanged, the event's id and data) and
//! skips the rest. The job is read as encoding/json reads it into the Go
//! agent's hasher.Job (read_job): keys matched case-insensitively, the
//! last of a repeated field winning, `null` leaving a field as it was,
//! integers for every field but the key, unpaired surrogate escapes and
//! invalid UTF-8 as U+FFFD; TestRustModuleAnswersLikeTheGoAgent compares
//! the two on such jobs. A job the scanner cannot read is an "error"
//! outcome naming the event, like the Go agent's (whose message differs).

use std::cell::RefCell;
use std::collections::BTreeMap;

/// MAX_REQUEST_BYTES is abi.MaxRequestBytes: paddock_alloc refuses more.
const MAX_REQUEST_BYTES: u32 = 4 << 20;

thread_local! {
    /// Every buffer handed to the host, by address, until paddock_free.
    static PINNED: RefCell<BTreeMap<u32, Vec<u8>>> = RefCell::new(BTreeMap::new());
}

/// pin keeps v alive for the host and returns its address.
fn pin(mut v: Vec<u8>) -> u32 {
    let p = v.as_mut_ptr() as usize as u32;
    PINNED.with(|m| m.borrow_mut().insert(p, v));
    p
}

#[no_mangle]
pub extern "C" fn paddock_abi_version() -> i32 {
    1
}

#[no_mangle]
pub extern "C" fn paddock_alloc(size: u32) -> u32 {
    if size > MAX_REQUEST_BYTES {
        return 0;
    }
    // At least one byte, so that the address is a real one.
    let mut v = vec![0u8; size.max(1) as usize];
    v.truncate(size as usize);
    pin(v)
}

#[no_mangle]
pub extern "C" fn paddock_free(ptr: u32) {
    PINNED.with(|m| {
        m.borrow_mut().remove(&ptr);
    });
}

#[no_mangle]
pub extern "C" fn paddock_turn(ptr: u32, len: u32) -> u64 {
    let out = PINNED.with(|m| match m.borrow().get(&ptr) {
        Some(buf) if (len as usize) <= buf.capacity() => {
            // SAFETY: the host wrote len bytes at ptr, inside the buffer
            // paddock_alloc returned (its capacity).
            let req = unsafe { std::slice::from_raw_parts(buf.as_ptr(), len as usize) };
            turn(req)
        }
        _ => result_error(b"{}", &format!("paddock_turn: no buffer of {} bytes at {:#x} from paddock_alloc", len, ptr)),
    });
    let n = out.len() as u64;
    (pin(out) as u64) << 32 | n
}

/// turn answers one request: the job's digest, or an error outcome.
fn turn(req: &[u8]) -> Vec<u8> {
    let r = match read_request(req) {
        Ok(r) => r,
        Err(e) => return result_error(b"{}", &format!("paddock_turn: decode request: {}", e)),
    };
    let data = match r.data {
        Some(d) => d,
        None => {
            return result_error(
                r.turn_ref,
                &format!("hasher: event {} has no data: want {{\"key\":…,\"seq\":…}}", r.event_id),
            )
        }
    };
    match read_job(data) {
        Ok((key, seq)) => {
            let digest = work(&key, seq);
            let mut out = Vec::with_capacity(r.turn_ref.len() + 80);
            out.extend_from_slice(b"{\"turn_ref\":");
            out.extend_from_slice(r.turn_ref);
            out.extend_from_slice(b",\"messages\":[{\"role\":\"assistant\",\"content\":\"");
            out.extend_from_slice(digest.as_bytes());
            out.extend_from_slice(b"\"}],\"outcome\":\"ok\"}");
            out
        }
        Err(e) => result_error(r.turn_ref, &format!("hasher: event {} data: {}", r.event_id, e)),
    }
}

/// result_error is an "error" outcome echoing turn_ref (raw JSON).
fn result_error(turn_ref: &[u8], msg: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(turn_ref.len() + msg.len() + 64);
    out.extend_from_slice(b"{\"turn_ref\":");
    out.extend_from_slice(turn_ref);
    out.extend_from_slice(b",\"messages\":[],\"outcome\":\"error\",\"error\":");
    quote(&mut out, msg);
    out.push(b'}');
    out
}

/// quote appends s as a JSON string.
fn quote(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            c if (c as u32) < 0x20 => out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes()),
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// work is hasher.Work: the key at offset 0, seq little-endian at offset
/// 64, then bytes i at i for i ≥ 72; the first 8 bytes of the SHA-256 in
/// hex.
fn work(key: &[u8], seq: i64) -> String {
    let mut buf = [0u8; 1024];
    let n = key.len().min(buf.len());
    buf[..n].copy_from_slice(&key[..n]);
    buf[64..72].copy_from_slice(&(seq as u64).to_le_bytes());
    for (i, b) in buf.iter_mut().enumerate().skip(72) {
        *b = i as u8;
    }
    let sum = sha256(&buf);
    let mut s = String::with_capacity(16);
    for b in &sum[..8] {
        s.push_str(&format!("{:02x}", b));
    }
    s
}

/// Request is what the agent reads of a TurnRequest.
struct Request<'a> {
    turn_ref: &'a [u8],
    event_id: i64,
    data: Option<&'a [u8]>,
}

fn read_request(s: &[u8]) -> Result<Request<'_>, String> {
    let mut p = Scanner { s, i: 0 };
    let mut r = Request { turn_ref: b"{}", event_id: 0, data: None };
    p.object(|p, k| {
        match k.as_slice() {
            b"turn_ref" => r.turn_ref = p.raw()?,
            b"event" => p.object(|p, k| {
                match k.as_slice() {
                    b"id" => r.event_id = p.int()?,
                    // A null data is data, as json.RawMessage keeps it
                    // (the Go agent then hashes the zero job).
                    b"data" => r.data = Some(p.raw()?),
                    _ => p.skip()?,
                }
                Ok(())
            })?,
            _ => p.skip()?,
        }
        Ok(())
    })?;
    p.end()?;
    Ok(r)
}

/// read_job reads the job's key and seq ({"idx","key","seq","t"}) as the Go
/// agent's json.Unmarshal into hasher.Job does: `null` is the zero job, a
/// key matches a field case-insensitively (field_of), `null` leaves a
/// field as it was, and idx and t must be integers too, though unused.
fn read_job(s: &[u8]) -> Result<(Vec<u8>, i64), String> {
    let mut p = Scanner { s, i: 0 };
    let (mut key, mut seq) = (Vec::new(), 0i64);
    if p.peek() == b'n' {
        p.literal(b"null")?;
        p.end()?;
        return Ok((key, seq));
    }
    p.object(|p, k| {
        let field = field_of(&k);
        if field.is_some() && p.peek() == b'n' {
            return p.literal(b"null");
        }
        match field {
            Some("key") => key = p.string()?,
            Some("seq") => seq = p.int()?,
            Some(_) => {
                p.int()?;
            }
            None => p.skip()?,
        }
        Ok(())
    })?;
    p.end()?;
    Ok((key, seq))
}

/// field_of is the Job field a key names, matched as encoding/json does
/// (bytes.EqualFold, Unicode simple folding): ASCII case aside, the Kelvin
/// sign folds to k and the long s to s; no other letter of the four names
/// has a fold outside ASCII.
fn field_of(k: &[u8]) -> Option<&'static str> {
    let mut folded = Vec::with_capacity(k.len());
    let mut i = 0;
    while i < k.len() {
        if k[i..].starts_with("\u{212a}".as_bytes()) {
            folded.push(b'k');
            i += 3;
        } else if k[i..].starts_with("\u{17f}".as_bytes()) {
            folded.push(b's');
            i += 2;
        } else {
            folded.push(k[i].to_ascii_lowercase());
            i += 1;
        }
    }
    ["idx", "key", "seq", "t"].into_iter().find(|f| f.as_bytes() == folded.as_slice())
}

/// Scanner is a cursor over JSON text.
struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> u8 {
        self.ws();
        if self.i < self.s.len() {
            self.s[self.i]
        } else {
            0
        }
    }

    fn fail<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{} at offset {}", what, self.i))
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        if self.peek() != c {
            return self.fail(&format!("want '{}'", c as char));
        }
        self.i += 1;
        Ok(())
    }

    fn literal(&mut self, lit: &[u8]) -> Result<(), String> {
        self.ws();
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            self.fail("invalid literal")
        }
    }

    fn end(&mut self) -> Result<(), String> {
        if self.peek() != 0 {
            return self.fail("data after the top-level value");
        }
        Ok(())
    }

    /// object calls f for each key, with the cursor before its value; f
    /// must consume the value.
    fn object(&mut self, mut f: impl FnMut(&mut Self, Vec<u8>) -> Result<(), String>) -> Result<(), String> {
        self.eat(b'{')?;
        if self.peek() == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            let k = self.string()?;
            self.eat(b':')?;
            f(self, k)?;
            match self.peek() {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return self.fail("want ',' or '}'"),
            }
        }
    }

    /// string reads a JSON string, unescaped (UTF-8 bytes).
    fn string(&mut self) -> Result<Vec<u8>, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            let c = match self.s.get(self.i) {
                Some(&c) => c,
                None => return self.fail("unterminated string"),
            };
            self.i += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = match self.s.get(self.i) {
                        Some(&e) => e,
                        None => return self.fail("unterminated escape"),
                    };
                    self.i += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            // As encoding/json: a surrogate makes a pair
                            // only with a low surrogate right after it,
                            // which is then consumed; any other surrogate
                            // is U+FFFD, and what follows it is read on.
                            let mut u = self.hex4()?;
                            if (0xd800..0xe000).contains(&u) {
                                let lo = self.peek_u4();
                                match lo {
                                    Some(lo) if u < 0xdc00 && (0xdc00..0xe000).contains(&lo) => {
                                        self.i += 6;
                                        u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                                    }
                                    _ => u = 0xfffd,
                                }
                            }
                            let ch = char::from_u32(u).unwrap_or('\u{fffd}');
                            let mut b = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                        }
                        _ => return self.fail("invalid escape"),
                    }
                }
                c if c < 0x20 => return self.fail("control character in string"),
                c if c < 0x80 => out.push(c),
                c => {
                    // As encoding/json: a valid UTF-8 sequence is kept,
                    // each byte of an invalid one becomes U+FFFD.
                    let w = match c {
                        0xc2..=0xdf => 2,
                        0xe0..=0xef => 3,
                        0xf0..=0xf4 => 4,
                        _ => 0,
                    };
                    let start = self.i - 1;
                    match self.s.get(start..start + w).filter(|_| w > 0).map(std::str::from_utf8) {
                        Some(Ok(ch)) => {
                            out.extend_from_slice(ch.as_bytes());
                            self.i = start + w;
                        }
                        _ => out.extend_from_slice("\u{fffd}".as_bytes()),
                    }
                }
            }
        }
    }

    /// peek_u4 is the code unit of a `\uXXXX` escape at the cursor, if one
    /// is there, without consuming it.
    fn peek_u4(&self) -> Option<u32> {
        if !self.s[self.i..].starts_with(b"\\u") {
            return None;
        }
        self.hex4_at(self.i + 2)
    }

    /// hex4 reads the four hex digits of a `\u` escape (after the `\u`).
    fn hex4(&mut self) -> Result<u32, String> {
        match self.hex4_at(self.i) {
            Some(u) => {
                self.i += 4;
                Ok(u)
            }
            None => self.fail("invalid \\u escape"),
        }
    }

    /// hex4_at is the value of the four hex digits at offset at.
    fn hex4_at(&self, at: usize) -> Option<u32> {
        self.s
            .get(at..at + 4)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|t| u32::from_str_radix(t, 16).ok())
    }

    /// int reads an integer that fits i64 (no fraction, no exponent).
    fn int(&mut self) -> Result<i64, String> {
        self.ws();
        let start = self.i;
        if self.s.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
            self.i += 1;
        }
        if matches!(self.s.get(self.i), Some(b'.' | b'e' | b'E')) {
            return self.fail("want an integer");
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()
            .and_then(|t| t.parse().ok())
            .map_or_else(|| self.fail("want an integer"), Ok)
    }

    /// raw consumes a value and returns its text.
    fn raw(&mut self) -> Result<&'a [u8], String> {
        self.ws();
        let start = self.i;
        self.skip()?;
        Ok(&self.s[start..self.i])
    }

    /// skip consumes one value of any kind.
    fn skip(&mut self) -> Result<(), String> {
        match self.peek() {
            b'{' => self.object(|p, _| p.skip()),
            b'[' => {
                self.i += 1;
                if self.peek() == b']' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip()?;
                    match self.peek() {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return self.fail("want ',' or ']'"),
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => {
                while self.i < self.s.len() && matches!(self.s[self.i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    self.i += 1;
                }
                Ok(())
            }
            _ => self.fail("want a value"),
        }
    }
}

/// sha256 is FIPS 180-4 SHA-256 of msg.
fn sha256(msg: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
    ];
    let mut padded = msg.to_vec();
    padded.push(0x80);
    while padded.len() % 64 != 56 {
        padded.push(0);
    }
    padded.extend_from_slice(&((msg.len() as u64) * 8).to_be_bytes());
    for block in padded.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (t, c) in block.chunks_exact(4).enumerate() {
            w[t] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for t in 16..64 {
            let s0 = w[t - 15].rotate_right(7) ^ w[t - 15].rotate_right(18) ^ (w[t - 15] >> 3);
            let s1 = w[t - 2].rotate_right(17) ^ w[t - 2].rotate_right(19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16].wrapping_add(s0).wrapping_add(w[t - 7]).wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for t in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh.wrapping_add(s1).wrapping_add(ch).wrapping_add(K[t]).wrapping_add(w[t]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (o, x) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&x.to_be_bytes());
    }
    out
}

package wire

import "github.com/paddock-dev/paddock/abi"

// FastDecode reports whether the fast path decodes data on its own.
func FastDecode(data []byte) bool {
	var req abi.TurnRequest
	d := decoder{data: data}
	return d.turnRequest(&req) && d.end()
}

// FastEncode reports whether the fast path encodes res on its own.
func FastEncode(res *abi.TurnResult) bool {
	_, ok := appendTurnResult(nil, res)
	return ok
}

// FastDecodeResult reports whether the fast path decodes data on its own.
func FastDecodeResult(data []byte) bool {
	var res abi.TurnResult
	d := decoder{data: data}
	return d.turnResult(&res) && d.end()
}

// FastEncodeRequest reports whether the fast path encodes req on its own.
func FastEncodeRequest(req *abi.TurnRequest) bool {
	_, ok := appendTurnRequest(nil, req)
	return ok
}

// Package executorproto implements version 2 of the executor wire protocol: a message is a
// series of length-prefixed chunks ended by a zero-length chunk, so a truncated message is
// never mistaken for a complete one. The Python executor (images/executor/readie_executor/
// protocol.py) implements the same framing; testdata/frames.golden.json keeps them identical.
//
// Framing: WriteMessage and ReadMessage (one message), the streaming Writer and Reader, Copy
// (relay one message chunk by chunk), with the errors ErrTruncated, ErrChunkTooLarge,
// ErrMessageTooLarge and ErrChunkSize. A worker: Dial (retries until a starting or restored
// executor accepts) and Call (one request, one response, honouring the context); Version is
// the protocol version a manifest's executor_protocol must name (manifest.CheckProtocol). The
// executor's exit codes: ExitSettings, ExitImport, ExitCheckpoint, ExitEnviron, explained by
// ExitMeaning.
//
// What is read into memory is bounded by the reader, as archive/tar bounds its headers: the
// protocol allows a message of MaxMessageSize (4 GiB), but ReadMessage and Call hold at most
// DefaultReadLimit (256 MiB) of it unless the caller sets another limit (ReadMessageLimit,
// Caller.MaxResponseSize). Each chunk header is checked against the limit before anything is
// allocated for its chunk; a message over it fails with ErrMessageTooLarge. Reader and Copy
// hold one chunk at a time and stop at MaxMessageSize.
package executorproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	// Version is the framing version this package speaks; manifest.json records it as
	// executor_protocol.
	Version = 2
	// DefaultChunkSize is the chunk size senders use unless told otherwise.
	DefaultChunkSize = 1 << 20
	// MaxChunkSize is the largest chunk a receiver accepts.
	MaxChunkSize = 64 << 20
	// MaxMessageSize is the largest payload the protocol allows, and the most Reader and Copy
	// pass on.
	MaxMessageSize int64 = 4 << 30
	// DefaultReadLimit is the largest payload ReadMessage and Call read into memory: a worker
	// that held whatever an executor sends could be made to hold 4 GiB per call.
	DefaultReadLimit int64 = 256 << 20

	headerSize = 8
)

var (
	// ErrTruncated means the stream ended before the message's terminator.
	ErrTruncated = errors.New("executorproto: truncated message")
	// ErrChunkTooLarge means a chunk header claimed more than MaxChunkSize bytes.
	ErrChunkTooLarge = errors.New("executorproto: chunk too large")
	// ErrMessageTooLarge means a message's payload would exceed the reader's limit:
	// MaxMessageSize, or the limit of ReadMessage, ReadMessageLimit or Call.
	ErrMessageTooLarge = errors.New("executorproto: message too large")
	// ErrChunkSize means a writer was given a chunk size outside 1..MaxChunkSize.
	ErrChunkSize = errors.New("executorproto: chunk size out of range")
)

func checkChunkSize(chunkSize int) error {
	if chunkSize < 1 || chunkSize > MaxChunkSize {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrChunkSize, chunkSize, MaxChunkSize)
	}
	return nil
}

// readHeader reads one chunk header and checks it against the limits (limit on the whole
// payload), given the payload bytes already received, before the caller allocates anything
// for the chunk.
func readHeader(r io.Reader, hdr *[headerSize]byte, received, limit int64) (int, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, fmt.Errorf("%w: stream ended after %d payload bytes, in a chunk header", ErrTruncated, received)
		}
		return 0, err
	}
	n := binary.BigEndian.Uint64(hdr[:])
	if n > MaxChunkSize {
		return 0, fmt.Errorf("%w: header claims %d bytes (limit %d)", ErrChunkTooLarge, n, MaxChunkSize)
	}
	if received+int64(n) > limit {
		return 0, fmt.Errorf("%w: more than %d bytes (the reader's limit)", ErrMessageTooLarge, limit)
	}
	return int(n), nil
}

func truncatedBody(err error, received int64) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: stream ended after %d payload bytes, inside a chunk", ErrTruncated, received)
	}
	return err
}

// WriteMessage writes payload as one message, in chunks of chunkSize bytes.
func WriteMessage(w io.Writer, payload []byte, chunkSize int) error {
	if err := checkChunkSize(chunkSize); err != nil {
		return err
	}
	if int64(len(payload)) > MaxMessageSize {
		return fmt.Errorf("%w: %d bytes", ErrMessageTooLarge, len(payload))
	}
	var hdr [headerSize]byte
	for len(payload) > 0 {
		n := min(len(payload), chunkSize)
		binary.BigEndian.PutUint64(hdr[:], uint64(n))
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := w.Write(payload[:n]); err != nil {
			return err
		}
		payload = payload[n:]
	}
	clear(hdr[:])
	_, err := w.Write(hdr[:])
	return err
}

// ReadMessage reads one whole message of at most DefaultReadLimit bytes and returns its
// payload (ReadMessageLimit).
func ReadMessage(r io.Reader) ([]byte, error) {
	return ReadMessageLimit(r, DefaultReadLimit)
}

// ReadMessageLimit reads one whole message and returns its payload, refusing with
// ErrMessageTooLarge, before allocating for it, a chunk that would take the payload over
// limit bytes (at most MaxMessageSize; zero or less means MaxMessageSize). Memory grows with
// the bytes that actually arrive, so a header that lies about its length cannot make it
// allocate more than a step ahead of the data, and never more than limit.
func ReadMessageLimit(r io.Reader, limit int64) ([]byte, error) {
	if limit <= 0 || limit > MaxMessageSize {
		limit = MaxMessageSize
	}
	var hdr [headerSize]byte
	var payload []byte
	for {
		n, err := readHeader(r, &hdr, int64(len(payload)), limit)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			if payload == nil {
				payload = []byte{}
			}
			return payload, nil
		}
		for n > 0 {
			// Read at most one default chunk at a time and grow by doubling, so memory tracks
			// the bytes that arrived (at most twice them plus one step), not what a header claims.
			step := min(n, DefaultChunkSize)
			start := len(payload)
			if cap(payload)-start < step {
				// start+step is within limit: the header was checked against it.
				grown := make([]byte, start, min(start+max(step, cap(payload)), int(limit)))
				copy(grown, payload)
				payload = grown
			}
			payload = payload[:start+step]
			if _, err := io.ReadFull(r, payload[start:]); err != nil {
				return nil, truncatedBody(err, int64(start))
			}
			n -= step
		}
	}
}

// Reader reads the payload of one message. It returns io.EOF after the terminator and never
// reads past it, so the underlying stream is left positioned at the next message.
type Reader struct {
	r         io.Reader
	hdr       [headerSize]byte
	remaining int // bytes left in the current chunk
	received  int64
	done      bool
	err       error
}

// NewReader returns a Reader over the next message in r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// Read implements io.Reader over the message's payload.
func (mr *Reader) Read(p []byte) (int, error) {
	if mr.err != nil {
		return 0, mr.err
	}
	if mr.done {
		return 0, io.EOF
	}
	for mr.remaining == 0 {
		n, err := readHeader(mr.r, &mr.hdr, mr.received, MaxMessageSize)
		if err != nil {
			mr.err = err
			return 0, err
		}
		if n == 0 {
			mr.done = true
			return 0, io.EOF
		}
		mr.remaining = n
	}
	if len(p) == 0 {
		return 0, nil
	}
	p = p[:min(len(p), mr.remaining)]
	n, err := mr.r.Read(p)
	mr.remaining -= n
	mr.received += int64(n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		if mr.remaining > 0 || !errors.Is(err, io.ErrUnexpectedEOF) {
			mr.err = truncatedBody(err, mr.received)
			return n, mr.err
		}
		// The chunk is complete; the missing terminator surfaces on the next Read.
	}
	return n, nil
}

// Writer streams one message of unknown length. Small writes are gathered up to the chunk
// size; a Write of a whole chunk or more goes straight to the stream. Close writes the
// terminator. An empty chunk is never written before it.
type Writer struct {
	w         io.Writer
	chunkSize int
	buf       []byte // allocated on the first write smaller than a chunk
	hdr       [headerSize]byte
	err       error
	closed    bool
}

// NewWriter returns a Writer that writes chunks of chunkSize bytes to w. A chunk size outside
// 1..MaxChunkSize makes every Write and Close fail with ErrChunkSize.
func NewWriter(w io.Writer, chunkSize int) *Writer {
	return &Writer{w: w, chunkSize: chunkSize, err: checkChunkSize(chunkSize)}
}

func (mw *Writer) writeChunk(p []byte) error {
	binary.BigEndian.PutUint64(mw.hdr[:], uint64(len(p)))
	if _, err := mw.w.Write(mw.hdr[:]); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	_, err := mw.w.Write(p)
	return err
}

// Write adds p to the message.
func (mw *Writer) Write(p []byte) (int, error) {
	if mw.err != nil {
		return 0, mw.err
	}
	if mw.closed {
		return 0, errors.New("executorproto: write after close")
	}
	written := 0
	for len(p) > 0 {
		if len(mw.buf) == 0 && len(p) >= mw.chunkSize {
			if err := mw.writeChunk(p[:mw.chunkSize]); err != nil {
				mw.err = err
				return written, err
			}
			p = p[mw.chunkSize:]
			written += mw.chunkSize
			continue
		}
		if mw.buf == nil {
			mw.buf = make([]byte, 0, mw.chunkSize)
		}
		n := copy(mw.buf[len(mw.buf):mw.chunkSize], p)
		mw.buf = mw.buf[:len(mw.buf)+n]
		p = p[n:]
		written += n
		if len(mw.buf) == mw.chunkSize {
			if err := mw.flush(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

func (mw *Writer) flush() error {
	if len(mw.buf) == 0 {
		return nil
	}
	if err := mw.writeChunk(mw.buf); err != nil {
		mw.err = err
		return err
	}
	mw.buf = mw.buf[:0]
	return nil
}

// Close writes any buffered bytes and the terminator. It does not close the underlying writer.
func (mw *Writer) Close() error {
	if mw.closed {
		return mw.err
	}
	mw.closed = true
	if mw.err != nil {
		return mw.err
	}
	if err := mw.flush(); err != nil {
		return err
	}
	if err := mw.writeChunk(nil); err != nil {
		mw.err = err
		return err
	}
	return nil
}

// Copy forwards exactly one message, framing included, from src to dst, one chunk at a time,
// and returns the number of payload bytes forwarded. It stops right after the terminator.
func Copy(dst io.Writer, src io.Reader) (int64, error) {
	// One allocation per call: the header and a bounded copy buffer, reused for every chunk.
	st := &copyState{}
	st.limited.R = src
	// Hiding dst's ReadFrom keeps io.CopyBuffer on our buffer: net.Conn's ReadFrom would
	// allocate a buffer of its own for every chunk.
	st.dst.Writer = dst
	var out io.Writer = &st.dst
	var received int64
	for {
		n, err := readHeader(src, &st.hdr, received, MaxMessageSize)
		if err != nil {
			return received, err
		}
		if _, err := dst.Write(st.hdr[:]); err != nil {
			return received, err
		}
		if n == 0 {
			return received, nil
		}
		st.limited.N = int64(n)
		copied, err := io.CopyBuffer(out, &st.limited, st.buf[:])
		received += copied
		if err != nil {
			return received, err
		}
		if copied < int64(n) {
			return received, fmt.Errorf("%w: stream ended after %d payload bytes, inside a chunk", ErrTruncated, received)
		}
	}
}

type writerOnly struct{ io.Writer }

type copyState struct {
	dst     writerOnly
	hdr     [headerSize]byte
	limited io.LimitedReader
	buf     [64 << 10]byte
}

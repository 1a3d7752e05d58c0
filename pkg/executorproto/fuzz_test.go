package executorproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func seedCorpus(f *testing.F) {
	f.Add([]byte{})
	f.Add(header(0))
	f.Add(append(append(header(5), "hello"...), header(0)...))
	f.Add(append(header(3), "ab"...))
	f.Add(header(MaxChunkSize + 1))
	f.Add(header(1 << 63))
}

// FuzzReadMessage checks that no input panics, that a success re-encodes to a message that
// decodes to the same payload, and that a failure is one of the protocol's errors.
func FuzzReadMessage(f *testing.F) {
	seedCorpus(f)
	f.Fuzz(func(t *testing.T, stream []byte) {
		payload, err := ReadMessage(bytes.NewReader(stream))
		if err != nil {
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrChunkTooLarge) && !errors.Is(err, ErrMessageTooLarge) {
				t.Fatalf("unexpected error class: %v", err)
			}
			return
		}
		// The payload never exceeds what the stream carried.
		if len(payload) > len(stream) {
			t.Fatalf("payload %d bytes from a %d-byte stream", len(payload), len(stream))
		}
		var buf bytes.Buffer
		if err := WriteMessage(&buf, payload, DefaultChunkSize); err != nil {
			t.Fatal(err)
		}
		again, err := ReadMessage(&buf)
		if err != nil || !bytes.Equal(again, payload) {
			t.Fatalf("re-encoded payload does not round trip: %v", err)
		}
	})
}

// FuzzReaderCopy checks that ReadMessage, Reader and Copy agree on every input.
func FuzzReaderCopy(f *testing.F) {
	seedCorpus(f)
	f.Fuzz(func(t *testing.T, stream []byte) {
		whole, errWhole := ReadMessage(bytes.NewReader(stream))
		streamed, errStreamed := io.ReadAll(NewReader(bytes.NewReader(stream)))
		var relayed bytes.Buffer
		n, errCopy := Copy(&relayed, bytes.NewReader(stream))
		if (errWhole == nil) != (errStreamed == nil) || (errWhole == nil) != (errCopy == nil) {
			t.Fatalf("disagree: ReadMessage %v, Reader %v, Copy %v", errWhole, errStreamed, errCopy)
		}
		if errWhole != nil {
			return
		}
		if !bytes.Equal(whole, streamed) || n != int64(len(whole)) {
			t.Fatalf("Reader or Copy payload differs from ReadMessage")
		}
		if !bytes.Equal(relayed.Bytes(), stream[:relayed.Len()]) {
			t.Fatalf("Copy changed the framing")
		}
	})
}

// FuzzReadMessageLimit checks ReadMessageLimit against the protocol's own limit: a success is
// the same payload and within the limit; ErrMessageTooLarge only for a stream whose headers
// claim more than the limit; any other failure is the unlimited reader's too.
func FuzzReadMessageLimit(f *testing.F) {
	f.Add([]byte{}, uint16(0))
	f.Add(append(append(header(5), "hello"...), header(0)...), uint16(4))
	f.Add(append(append(header(5), "hello"...), header(0)...), uint16(5))
	f.Add(append(append(header(3), "abc"...), header(2)...), uint16(4))
	f.Add(header(MaxChunkSize+1), uint16(1))
	f.Fuzz(func(t *testing.T, stream []byte, limit uint16) {
		whole, errWhole := ReadMessageLimit(bytes.NewReader(stream), MaxMessageSize)
		got, err := ReadMessageLimit(bytes.NewReader(stream), int64(limit))
		switch {
		case err == nil:
			if errWhole != nil || !bytes.Equal(got, whole) || (limit > 0 && len(got) > int(limit)) {
				t.Fatalf("limit %d: %d bytes; unlimited: %d bytes, %v", limit, len(got), len(whole), errWhole)
			}
		case errors.Is(err, ErrMessageTooLarge):
			if limit == 0 || (errWhole == nil && len(whole) <= int(limit)) {
				t.Fatalf("limit %d refused a message of %d bytes the unlimited reader took: %v", limit, len(whole), err)
			}
		case errWhole == nil:
			t.Fatalf("limit %d: %v; unlimited: ok", limit, err)
		}
	})
}

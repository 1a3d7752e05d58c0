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

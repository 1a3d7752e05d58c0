package executorproto

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"testing"
)

type goldenCase struct {
	Name       string `json:"name"`
	ChunkSize  int    `json:"chunk_size"`
	PayloadHex string `json:"payload_hex"`
	EncodedHex string `json:"encoded_hex"`
}

type goldenFile struct {
	ProtocolVersion int          `json:"protocol_version"`
	Cases           []goldenCase `json:"cases"`
}

func loadGolden(t testing.TB) goldenFile {
	t.Helper()
	data, err := os.ReadFile("../../testdata/frames.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 9 {
		t.Fatalf("golden fixture has %d cases, want at least 9", len(g.Cases))
	}
	return g
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenVersion(t *testing.T) {
	if g := loadGolden(t); g.ProtocolVersion != Version {
		t.Fatalf("fixture protocol_version = %d, Go Version = %d", g.ProtocolVersion, Version)
	}
}

func TestGoldenSpecExample(t *testing.T) {
	// The byte-level example of the spec, written out by hand.
	want := mustHex(t, "0000000000000006"+"68656c6c6f20"+"0000000000000005"+"776f726c64"+"0000000000000000")
	for _, c := range loadGolden(t).Cases {
		if c.Name == "hello_world_spec_example" {
			if got := mustHex(t, c.EncodedHex); !bytes.Equal(got, want) {
				t.Fatalf("fixture hello world = %x, spec says %x", got, want)
			}
			return
		}
	}
	t.Fatal("fixture lacks the spec's hello world case")
}

func TestGolden(t *testing.T) {
	for _, c := range loadGolden(t).Cases {
		t.Run(c.Name, func(t *testing.T) {
			payload, encoded := mustHex(t, c.PayloadHex), mustHex(t, c.EncodedHex)

			got, err := ReadMessage(bytes.NewReader(encoded))
			if err != nil || !bytes.Equal(got, payload) {
				t.Fatalf("ReadMessage = %d bytes, %v; want %d bytes", len(got), err, len(payload))
			}
			streamed, err := io.ReadAll(NewReader(bytes.NewReader(encoded)))
			if err != nil || !bytes.Equal(streamed, payload) {
				t.Fatalf("Reader = %d bytes, %v; want %d bytes", len(streamed), err, len(payload))
			}

			var buf bytes.Buffer
			if err := WriteMessage(&buf, payload, c.ChunkSize); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), encoded) {
				t.Fatalf("WriteMessage differs from the Python bytes")
			}
			buf.Reset()
			w := NewWriter(&buf, c.ChunkSize)
			if _, err := w.Write(payload); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), encoded) {
				t.Fatalf("Writer differs from the Python bytes")
			}
			buf.Reset()
			n, err := Copy(&buf, bytes.NewReader(encoded))
			if err != nil || n != int64(len(payload)) || !bytes.Equal(buf.Bytes(), encoded) {
				t.Fatalf("Copy = %d, %v; want %d and identical bytes", n, err, len(payload))
			}
		})
	}
}

func encode(t testing.TB, payload []byte, chunkSize int) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteMessage(&buf, payload, chunkSize); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestTruncationAtEveryPrefix(t *testing.T) {
	encoded := encode(t, []byte("hello world, in chunks"), 5)
	for cut := 0; cut < len(encoded); cut++ {
		prefix := encoded[:cut]
		if got, err := ReadMessage(bytes.NewReader(prefix)); !errors.Is(err, ErrTruncated) {
			t.Fatalf("ReadMessage(%d of %d bytes) = %q, %v; want ErrTruncated", cut, len(encoded), got, err)
		}
		if _, err := io.ReadAll(NewReader(bytes.NewReader(prefix))); !errors.Is(err, ErrTruncated) {
			t.Fatalf("Reader(%d of %d bytes): %v; want ErrTruncated", cut, len(encoded), err)
		}
		if _, err := Copy(io.Discard, bytes.NewReader(prefix)); !errors.Is(err, ErrTruncated) {
			t.Fatalf("Copy(%d of %d bytes): %v; want ErrTruncated", cut, len(encoded), err)
		}
	}
}

func header(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func TestChunkTooLarge(t *testing.T) {
	stream := header(MaxChunkSize + 1) // no body: the check must come before any read or allocation
	if _, err := ReadMessage(bytes.NewReader(stream)); !errors.Is(err, ErrChunkTooLarge) {
		t.Fatalf("ReadMessage: %v", err)
	}
	if _, err := io.ReadAll(NewReader(bytes.NewReader(stream))); !errors.Is(err, ErrChunkTooLarge) {
		t.Fatalf("Reader: %v", err)
	}
	if _, err := Copy(io.Discard, bytes.NewReader(stream)); !errors.Is(err, ErrChunkTooLarge) {
		t.Fatalf("Copy: %v", err)
	}
	if n := bytesAllocated(func() { ReadMessage(bytes.NewReader(stream)) }); n > 4096 {
		t.Fatalf("ReadMessage allocated %d bytes for a rejected header", n)
	}
	// A legal header with no body behind it must not make ReadMessage allocate the whole chunk.
	lying := header(MaxChunkSize)
	if n := bytesAllocated(func() { ReadMessage(bytes.NewReader(lying)) }); n > MaxChunkSize/8 {
		t.Fatalf("ReadMessage allocated %d bytes for a 64 MiB header with no body", n)
	}
}

// maxChunks streams legal full-size chunks forever without holding them in memory.
type maxChunks struct {
	pos int64
}

func (m *maxChunks) Read(p []byte) (int, error) {
	const period = headerSize + MaxChunkSize
	off := m.pos % period
	var n int
	if off < headerSize {
		n = copy(p, header(MaxChunkSize)[off:])
	} else {
		// The body's contents do not matter; whatever p holds is fine.
		n = int(min(int64(len(p)), period-off))
	}
	m.pos += int64(n)
	return n, nil
}

func bytesAllocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestMessageTooLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 4 GiB")
	}
	n, err := io.Copy(io.Discard, NewReader(&maxChunks{}))
	if !errors.Is(err, ErrMessageTooLarge) || n != MaxMessageSize {
		t.Fatalf("Reader: %d bytes, %v; want ErrMessageTooLarge after exactly %d", n, err, MaxMessageSize)
	}
	n, err = Copy(io.Discard, &maxChunks{})
	if !errors.Is(err, ErrMessageTooLarge) || n != MaxMessageSize {
		t.Fatalf("Copy: %d bytes, %v; want ErrMessageTooLarge after exactly %d", n, err, MaxMessageSize)
	}
}

// fullChunks streams count legal chunks of MaxChunkSize and the terminator without holding
// them, and counts the bytes it was asked for.
type fullChunks struct {
	maxChunks
	count int64
}

func (f *fullChunks) Read(p []byte) (int, error) {
	end := f.count * (headerSize + MaxChunkSize)
	if f.pos >= end {
		n := copy(p, header(0)[f.pos-end:])
		f.pos += int64(n)
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
	return f.maxChunks.Read(p[:min(int64(len(p)), end-f.pos)])
}

// TestReadMessageDefaultLimit: a legal message of 320 MiB is refused by ReadMessage once the
// next chunk would take it over DefaultReadLimit (256 MiB): before reading or allocating for
// that chunk.
func TestReadMessageDefaultLimit(t *testing.T) {
	src := &fullChunks{count: 5}
	var err error
	allocated := bytesAllocated(func() { _, err = ReadMessage(src) })
	if !errors.Is(err, ErrMessageTooLarge) || !strings.Contains(err.Error(), "more than 268435456 bytes") {
		t.Fatalf("ReadMessage of 320 MiB = %v, want ErrMessageTooLarge naming the limit of 256 MiB", err)
	}
	if want := DefaultReadLimit + 5*headerSize; src.pos != want {
		t.Errorf("read %d bytes of the stream, want %d (4 chunks and the 5th header)", src.pos, want)
	}
	// Growing by doubling, capped at the limit: the buffers come to less than twice it.
	if allocated > 2*uint64(DefaultReadLimit) {
		t.Errorf("allocated %d bytes, more than twice the limit", allocated)
	}
	// The same message through Reader, which holds a chunk at a time, is the protocol's.
	n, err := io.Copy(io.Discard, NewReader(&fullChunks{count: 5}))
	if err != nil || n != 5*MaxChunkSize {
		t.Fatalf("Reader: %d bytes, %v", n, err)
	}
}

// TestReadMessageLimit: the caller's limit, checked against each header before its chunk is
// allocated or read.
func TestReadMessageLimit(t *testing.T) {
	msg := encode(t, bytes.Repeat([]byte("x"), 30), 10)
	for _, tc := range []struct {
		limit int64
		ok    bool
	}{{29, false}, {20, false}, {1, false}, {30, true}, {31, true}, {0, true}, {-1, true}, {MaxMessageSize + 1, true}} {
		got, err := ReadMessageLimit(bytes.NewReader(msg), tc.limit)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrMessageTooLarge)) || (err == nil && len(got) != 30) {
			t.Errorf("limit %d: %d bytes, %v", tc.limit, len(got), err)
		}
	}
	// A header that claims a whole chunk over the limit: refused, nothing allocated for it.
	lying := append(header(MaxChunkSize), make([]byte, 100)...)
	var err error
	if n := bytesAllocated(func() { _, err = ReadMessageLimit(bytes.NewReader(lying), 1<<20) }); n > 4096 || !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("allocated %d bytes, %v", n, err)
	}
}

func TestZeroChunkEndsMessage(t *testing.T) {
	stream := append(encode(t, []byte("abc"), 2), encode(t, []byte("next"), 10)...)
	br := bytes.NewReader(stream)
	got, err := io.ReadAll(NewReader(br))
	if err != nil || string(got) != "abc" {
		t.Fatalf("first message = %q, %v", got, err)
	}
	// The Reader must leave the stream right after the terminator.
	if got, err := ReadMessage(br); err != nil || string(got) != "next" {
		t.Fatalf("second message = %q, %v", got, err)
	}
	var relayed bytes.Buffer
	br = bytes.NewReader(stream)
	if _, err := Copy(&relayed, br); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(relayed.Bytes(), encode(t, []byte("abc"), 2)) || br.Len() != len(encode(t, []byte("next"), 10)) {
		t.Fatalf("Copy forwarded %x and left %d bytes", relayed.Bytes(), br.Len())
	}
}

func TestWriterChunkSizeRange(t *testing.T) {
	for _, size := range []int{0, -1, MaxChunkSize + 1} {
		if err := WriteMessage(io.Discard, []byte("x"), size); !errors.Is(err, ErrChunkSize) {
			t.Errorf("WriteMessage chunk %d: %v", size, err)
		}
		w := NewWriter(io.Discard, size)
		if _, err := w.Write([]byte("x")); !errors.Is(err, ErrChunkSize) {
			t.Errorf("Writer.Write chunk %d: %v", size, err)
		}
		if err := w.Close(); !errors.Is(err, ErrChunkSize) {
			t.Errorf("Writer.Close chunk %d: %v", size, err)
		}
	}
}

// chunkLengths parses a well-formed stream and returns its chunk lengths, terminator included.
func chunkLengths(t *testing.T, stream []byte) []uint64 {
	var out []uint64
	for len(stream) >= headerSize {
		n := binary.BigEndian.Uint64(stream)
		out = append(out, n)
		stream = stream[headerSize+int(n):]
		if n == 0 {
			break
		}
	}
	if len(stream) != 0 {
		t.Fatalf("%d bytes after the terminator", len(stream))
	}
	return out
}

func TestWriterNeverWritesEmptyChunk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		chunkSize := 1 + rng.IntN(50)
		var want, stream bytes.Buffer
		w := NewWriter(&stream, chunkSize)
		for range rng.IntN(20) {
			p := make([]byte, rng.IntN(3*chunkSize)) // empty writes included
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
			want.Write(p)
			if n, err := w.Write(p); err != nil || n != len(p) {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		lengths := chunkLengths(t, stream.Bytes())
		for i, n := range lengths[:len(lengths)-1] {
			if n == 0 || n > uint64(chunkSize) {
				t.Fatalf("chunk %d has %d bytes (chunk size %d)", i, n, chunkSize)
			}
		}
		if got, err := ReadMessage(&stream); err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("round trip: %v", err)
		}
	}
}

func TestRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 200; round++ {
		payload := make([]byte, rng.IntN(5000))
		for i := range payload {
			payload[i] = byte(rng.Uint32())
		}
		chunkSize := 1 + rng.IntN(700)
		encoded := encode(t, payload, chunkSize)
		got, err := ReadMessage(bufio.NewReaderSize(bytes.NewReader(encoded), 16))
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("round %d: ReadMessage %v", round, err)
		}
		var relayed bytes.Buffer
		if n, err := Copy(&relayed, bytes.NewReader(encoded)); err != nil || n != int64(len(payload)) || !bytes.Equal(relayed.Bytes(), encoded) {
			t.Fatalf("round %d: Copy %d, %v", round, n, err)
		}
	}
}

func TestEmptyPayloadIsNotNil(t *testing.T) {
	got, err := ReadMessage(bytes.NewReader(header(0)))
	if err != nil || got == nil || len(got) != 0 {
		t.Fatalf("ReadMessage(empty) = %#v, %v", got, err)
	}
}

func TestCopyNoAllocationPerChunk(t *testing.T) {
	few := encode(t, bytes.Repeat([]byte("a"), 4<<10), 1<<10)    // 4 chunks
	many := encode(t, bytes.Repeat([]byte("a"), 256<<10), 1<<10) // 256 chunks
	measure := func(stream []byte) float64 {
		return testing.AllocsPerRun(20, func() {
			if _, err := Copy(io.Discard, bytes.NewReader(stream)); err != nil {
				t.Fatal(err)
			}
		})
	}
	if a, b := measure(few), measure(many); b > a {
		t.Fatalf("Copy allocations grow with chunks: %v for 4 chunks, %v for 256", a, b)
	}
}

package manifest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func header(meta string) []byte {
	var b bytes.Buffer
	b.WriteString(ImageMagic)
	binary.Write(&b, binary.BigEndian, uint64(len(meta)))
	b.WriteString(meta)
	b.WriteString("state follows")
	return b.Bytes()
}

func TestDecodeImageHeader(t *testing.T) {
	h, err := DecodeImageHeader(bytes.NewReader(header(`{"runsc_version":"readie-x","compression":"none","_timestamp":"t"}`)))
	if err != nil || h.RunscVersion() != "readie-x" || h.Compression() != "none" {
		t.Fatalf("%v %v", h, err)
	}
	if h, _ := DecodeImageHeader(bytes.NewReader(header(`{}`))); h.Compression() != "none" {
		t.Errorf("an image without the compression key is uncompressed, got %q", h.Compression())
	}
	huge := append([]byte(ImageMagic), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	for name, data := range map[string][]byte{
		"empty":     nil,
		"bad magic": header(`{}`)[1:],
		"short":     header(`{"runsc_version":"x"}`)[:20],
		"not json":  header(`{"runsc_version":`),
		"huge":      huge,
		"not a map": header(`[1,2]`),
	} {
		if _, err := DecodeImageHeader(bytes.NewReader(data)); !errors.Is(err, ErrImageHeader) {
			t.Errorf("%s: err = %v, want ErrImageHeader", name, err)
		}
	}
}

func FuzzDecodeImageHeader(f *testing.F) {
	f.Add(header(`{"runsc_version":"x"}`))
	f.Add([]byte(ImageMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeImageHeader(bytes.NewReader(data))
		if err == nil && h == nil && !bytes.Contains(data, []byte("null")) {
			t.Fatal("no header and no error")
		}
	})
}

package client

import (
	"bufio"
	"io"
	"strings"
)

// sseReader reads server-sent events line by line: each call returns one
// field, or field "" at the blank line that ends an event. Comment lines
// (keepalives) are skipped.
type sseReader struct{ sc *bufio.Scanner }

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &sseReader{sc: sc}
}

func (s *sseReader) next() (field, value string, err error) {
	for s.sc.Scan() {
		line := s.sc.Text()
		if line == "" {
			return "", "", nil
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ = strings.Cut(line, ":")
		return field, strings.TrimPrefix(value, " "), nil
	}
	if err := s.sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", io.EOF
}

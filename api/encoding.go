package api

import (
	"encoding/base64"
	"fmt"
	"unicode/utf8"
)

// EncodeBytes returns b as a JSON-safe string and its encoding: UTF-8 text
// as is, anything else as base64, so no byte is lost.
func EncodeBytes(b []byte) (s, encoding string) {
	if utf8.Valid(b) {
		return string(b), EncodingUTF8
	}
	return base64.StdEncoding.EncodeToString(b), EncodingBase64
}

// DecodeBytes reverses EncodeBytes; an unknown encoding or bad base64 is an
// error naming field.
func DecodeBytes(field, s, encoding string) ([]byte, error) {
	switch encoding {
	case EncodingUTF8:
		return []byte(s), nil
	case EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("%s: bad base64: %v", field, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("%s encoding %q: want \"\" or \"base64\"", field, encoding)
}

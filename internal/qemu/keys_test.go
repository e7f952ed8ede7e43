package qemu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestKeyCombo(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "Return", want: []string{"ret"}},
		{in: "ret", want: []string{"ret"}},
		{in: "Enter", want: []string{"ret"}},
		{in: "ctrl-alt-f2", want: []string{"ctrl", "alt", "f2"}},
		{in: "Ctrl+Alt+F2", want: []string{"ctrl", "alt", "f2"}},
		{in: "ctrl-c", want: []string{"ctrl", "c"}},
		{in: "a", want: []string{"a"}},
		{in: "A", want: []string{"shift", "a"}},
		{in: "shift-A", want: []string{"shift", "a"}},
		{in: "ctrl-A", want: []string{"ctrl", "shift", "a"}},
		{in: "shift-Tab", want: []string{"shift", "tab"}},
		{in: "-", want: []string{"minus"}},
		{in: "+", want: []string{"shift", "equal"}},
		{in: "ctrl--", want: []string{"ctrl", "minus"}},
		{in: "ctrl-+", want: []string{"ctrl", "shift", "equal"}},
		{in: "ctrl+-", want: []string{"ctrl", "minus"}},
		{in: "@", want: []string{"shift", "2"}},
		{in: "BackSpace", want: []string{"backspace"}},
		{in: "Page_Up", want: []string{"pgup"}},
		{in: "super", want: []string{"meta_l"}},
		{in: "Escape", want: []string{"esc"}},
		{in: "space", want: []string{"spc"}},
		{in: "kp_enter", want: []string{"kp_enter"}},
		{in: "F12", want: []string{"f12"}},
		{in: "sysrq", want: []string{"sysrq"}},
		{in: "", err: "empty"},
		{in: "ctrl-", err: "ends with"},
		{in: "ctrl-nosuchkey", err: `unknown key "nosuchkey"`},
		{in: "é", err: "unknown key"},
		{in: "\x01", err: "unknown key"},
	} {
		got, err := keyCombo(tc.in)
		if tc.err != "" {
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("keyCombo(%q): got %v, %v; want an ErrBadInput saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("keyCombo(%q): got %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestKeyTables(t *testing.T) {
	// Every key the tables name is one QEMU knows.
	for c, k := range charKeys {
		if !qcodes[k.qcode] {
			t.Errorf("character %q maps to unknown qcode %q", c, k.qcode)
		}
	}
	for name, ks := range keyAliases {
		for _, k := range ks {
			if !qcodes[k] {
				t.Errorf("alias %q maps to unknown qcode %q", name, k)
			}
		}
		if qcodes[name] {
			t.Errorf("alias %q shadows a qcode", name)
		}
	}
	// All 95 printable ASCII characters have a key.
	for c := byte(' '); c <= '~'; c++ {
		if _, ok := charKeys[c]; !ok {
			t.Errorf("no key for %q", c)
		}
	}
}

func TestTextKeys(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want [][]string
		err  string
	}{
		{in: "", want: nil},
		{in: "Hi!", want: [][]string{{"shift", "h"}, {"i"}, {"shift", "1"}}},
		{in: "echo $HOME > /tmp/x\n", want: [][]string{{"e"}, {"c"}, {"h"}, {"o"}, {"spc"}, {"shift", "4"},
			{"shift", "h"}, {"shift", "o"}, {"shift", "m"}, {"shift", "e"}, {"spc"}, {"shift", "dot"}, {"spc"},
			{"slash"}, {"t"}, {"m"}, {"p"}, {"slash"}, {"x"}, {"ret"}}},
		{in: "a\tb\r\nc\rd", want: [][]string{{"a"}, {"tab"}, {"b"}, {"ret"}, {"c"}, {"ret"}, {"d"}}},
		{in: `-_=+[{]}\|;:'",<.>/?` + "`~", want: [][]string{{"minus"}, {"shift", "minus"}, {"equal"}, {"shift", "equal"},
			{"bracket_left"}, {"shift", "bracket_left"}, {"bracket_right"}, {"shift", "bracket_right"},
			{"backslash"}, {"shift", "backslash"}, {"semicolon"}, {"shift", "semicolon"}, {"apostrophe"},
			{"shift", "apostrophe"}, {"comma"}, {"shift", "comma"}, {"dot"}, {"shift", "dot"}, {"slash"},
			{"shift", "slash"}, {"grave_accent"}, {"shift", "grave_accent"}}},
		{in: "0123456789", want: [][]string{{"0"}, {"1"}, {"2"}, {"3"}, {"4"}, {"5"}, {"6"}, {"7"}, {"8"}, {"9"}}},
		{in: "naïve", err: `character 'ï' at byte 2`},
		{in: "a\x1bb", err: `character '\x1b' at byte 1`},
	} {
		got, err := textKeys(tc.in)
		if tc.err != "" {
			if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("textKeys(%q): got %v; want an ErrBadInput saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("textKeys(%q):\n got %q, %v\nwant %q", tc.in, got, err, tc.want)
		}
	}
}

func TestAbsAxis(t *testing.T) {
	for _, n := range []int{1, 2, 640, 720, 1024, 1280, 1920} {
		for _, p := range []int{0, 1, n / 2, n - 2, n - 1} {
			if p < 0 || p >= n {
				continue
			}
			v, ok := absAxis(p, n)
			if !ok || v < 0 || v > absMax {
				t.Fatalf("absAxis(%d, %d) = %d, %v", p, n, v, ok)
			}
			// A guest maps the axis back to pixels as v*n/(absMax+1).
			if back := v * n / (absMax + 1); back != p {
				t.Errorf("absAxis(%d, %d) = %d, which a guest maps back to %d", p, n, v, back)
			}
		}
		for _, p := range []int{-1, n} {
			if _, ok := absAxis(p, n); ok {
				t.Errorf("absAxis(%d, %d) accepted a pixel off the screen", p, n)
			}
		}
	}
}

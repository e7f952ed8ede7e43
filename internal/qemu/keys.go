package qemu

import (
	"errors"
	"fmt"
	"strings"
)

// ErrBadInput is wrapped by the errors SendKeys, TypeText, PointerMove
// and Click return, before sending anything, for input they cannot
// express: an unknown key name, a character with no key on a US
// keyboard, an unknown button, a point off the screen.
var ErrBadInput = errors.New("invalid input")

func badInput(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadInput, fmt.Sprintf(format, args...))
}

// qcodes are QEMU 7.2's key codes (QAPI enum QKeyCode), which send-key
// takes; they name keys of a US keyboard, not characters.
var qcodes = setOf(
	"shift", "shift_r", "alt", "alt_r", "ctrl", "ctrl_r", "menu", "esc",
	"1", "2", "3", "4", "5", "6", "7", "8", "9", "0", "minus", "equal", "backspace", "tab",
	"q", "w", "e", "r", "t", "y", "u", "i", "o", "p", "bracket_left", "bracket_right", "ret",
	"a", "s", "d", "f", "g", "h", "j", "k", "l", "semicolon", "apostrophe", "grave_accent", "backslash",
	"z", "x", "c", "v", "b", "n", "m", "comma", "dot", "slash", "asterisk", "spc", "caps_lock",
	"f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9", "f10", "f11", "f12",
	"num_lock", "scroll_lock", "kp_divide", "kp_multiply", "kp_subtract", "kp_add", "kp_enter", "kp_decimal",
	"sysrq", "kp_0", "kp_1", "kp_2", "kp_3", "kp_4", "kp_5", "kp_6", "kp_7", "kp_8", "kp_9", "less",
	"print", "home", "pgup", "pgdn", "end", "left", "up", "down", "right", "insert", "delete",
	"stop", "again", "props", "undo", "front", "copy", "open", "paste", "find", "cut", "lf", "help",
	"meta_l", "meta_r", "compose", "pause", "ro", "hiragana", "henkan", "yen", "muhenkan",
	"katakanahiragana", "kp_comma", "kp_equals", "power", "sleep", "wake", "audionext", "audioprev",
	"audiostop", "audioplay", "audiomute", "volumeup", "volumedown", "mediaselect", "mail",
	"calculator", "computer", "ac_home", "ac_back", "ac_forward", "ac_refresh", "ac_bookmarks",
	"lang1", "lang2",
)

// keyAliases are other names for keys, lower case: X11 keysym names (as
// xdotool takes them) and common spellings. A name may stand for a
// combination ("plus" is shift and "=").
var keyAliases = map[string][]string{
	"return": {"ret"}, "enter": {"ret"}, "space": {"spc"}, "escape": {"esc"},
	"bksp": {"backspace"}, "del": {"delete"}, "ins": {"insert"},
	"pageup": {"pgup"}, "page_up": {"pgup"}, "prior": {"pgup"},
	"pagedown": {"pgdn"}, "page_down": {"pgdn"}, "next": {"pgdn"},
	"control": {"ctrl"}, "control_l": {"ctrl"}, "ctrl_l": {"ctrl"}, "control_r": {"ctrl_r"},
	"shift_l": {"shift"}, "alt_l": {"alt"}, "altgr": {"alt_r"}, "iso_level3_shift": {"alt_r"},
	"super": {"meta_l"}, "super_l": {"meta_l"}, "super_r": {"meta_r"}, "meta": {"meta_l"},
	"win": {"meta_l"}, "windows": {"meta_l"}, "cmd": {"meta_l"},
	"capslock": {"caps_lock"}, "numlock": {"num_lock"}, "scrolllock": {"scroll_lock"},
	"printscreen": {"print"}, "prtsc": {"print"}, "break": {"pause"},
	"grave": {"grave_accent"}, "quote": {"apostrophe"}, "period": {"dot"},
	"bracketleft": {"bracket_left"}, "bracketright": {"bracket_right"},
	"plus": {"shift", "equal"}, "underscore": {"shift", "minus"},
	"kp_plus": {"kp_add"}, "kp_minus": {"kp_subtract"},
}

// charKeys maps the printable ASCII characters to the key that types
// them on a US keyboard, and whether shift is held.
var charKeys = func() map[byte]charKey {
	m := map[byte]charKey{' ': {"spc", false}}
	for c := byte('a'); c <= 'z'; c++ {
		m[c] = charKey{string(c), false}
		m[c-'a'+'A'] = charKey{string(c), true}
	}
	for c := byte('0'); c <= '9'; c++ {
		m[c] = charKey{string(c), false}
	}
	plain := map[byte]string{'-': "minus", '=': "equal", '[': "bracket_left", ']': "bracket_right",
		'\\': "backslash", ';': "semicolon", '\'': "apostrophe", '`': "grave_accent",
		',': "comma", '.': "dot", '/': "slash"}
	for c, k := range plain {
		m[c] = charKey{k, false}
	}
	shifted := map[byte]string{'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6",
		'&': "7", '*': "8", '(': "9", ')': "0", '_': "minus", '+': "equal", '{': "bracket_left",
		'}': "bracket_right", '|': "backslash", ':': "semicolon", '"': "apostrophe", '~': "grave_accent",
		'<': "comma", '>': "dot", '?': "slash"}
	for c, k := range shifted {
		m[c] = charKey{k, true}
	}
	return m
}()

type charKey struct {
	qcode string
	shift bool
}

func (k charKey) combo() []string {
	if k.shift {
		return []string{"shift", k.qcode}
	}
	return []string{k.qcode}
}

func setOf(s ...string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, k := range s {
		m[k] = true
	}
	return m
}

// keyCombo turns a key combination such as "Return", "ctrl-alt-f2",
// "ctrl+c", "A" (shift and a) or "ctrl--" (ctrl and minus) into the
// qcodes send-key presses together, in order. Keys are joined by '-' or
// '+'; each is a single character (typed as on a US keyboard, shift
// included), a QEMU qcode (any case) or an alias such as "Enter",
// "Escape", "Page_Up" or "super".
func keyCombo(s string) ([]string, error) {
	var names []string
	for i := 0; i < len(s); {
		// A separator where a key is expected is the key itself.
		j := i + 1
		for j < len(s) && s[j] != '-' && s[j] != '+' {
			j++
		}
		names = append(names, s[i:j])
		if j == len(s) {
			break
		}
		if j+1 == len(s) {
			return nil, badInput("key combination %q ends with %q", s, s[j])
		}
		i = j + 1
	}
	if len(names) == 0 {
		return nil, badInput("empty key combination")
	}
	var codes []string
	seen := map[string]bool{}
	for _, n := range names {
		keys, err := keyName(n)
		if err != nil {
			return nil, fmt.Errorf("key combination %q: %w", s, err)
		}
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				codes = append(codes, k)
			}
		}
	}
	return codes, nil
}

func keyName(n string) ([]string, error) {
	if len(n) == 1 {
		if k, ok := charKeys[n[0]]; ok {
			return k.combo(), nil
		}
	}
	l := strings.ToLower(n)
	if qcodes[l] {
		return []string{l}, nil
	}
	if k, ok := keyAliases[l]; ok {
		return k, nil
	}
	return nil, badInput("unknown key %q", n)
}

// textKeys turns text into the key combinations that type it on a US
// keyboard: printable ASCII, '\n' (Return; "\r\n" is one), '\r' and
// '\t'. Anything else is an error.
func textKeys(text string) ([][]string, error) {
	var out [][]string
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '\r' && i+1 < len(text) && text[i+1] == '\n':
			continue
		case c == '\n' || c == '\r':
			out = append(out, []string{"ret"})
		case c == '\t':
			out = append(out, []string{"tab"})
		default:
			k, ok := charKeys[c]
			if !ok {
				r := []rune(text[i:])[0]
				return nil, badInput("character %q at byte %d has no key on a US keyboard", r, i)
			}
			out = append(out, k.combo())
		}
	}
	return out, nil
}

package api

// InputRequest is the body of POST /v1/sandboxes/{id}/input: keyboard and
// pointer events for a vm sandbox's display, sent in order. The screen
// itself is GET /v1/sandboxes/{id}/screen (a PNG). Other backends answer
// 400 not_supported.
type InputRequest struct {
	Events []InputEvent `json:"events"`
}

// InputEvent is one keyboard or pointer action.
type InputEvent struct {
	// Type is InputText, InputKey, InputMove or InputClick.
	Type string `json:"type"`
	// Text is typed as on a US keyboard (printable ASCII, \n, \t).
	Text string `json:"text,omitempty"`
	// Key is one combination: "Return", "ctrl-alt-f2", "shift-a", "F5".
	Key string `json:"key,omitempty"`
	// X, Y are a pixel of the screen (0,0 at its top left), for moves
	// and clicks.
	X int `json:"x,omitempty"`
	Y int `json:"y,omitempty"`
	// Button is "left" (default), "middle", "right", "wheel-up" or
	// "wheel-down".
	Button string `json:"button,omitempty"`
}

// Input event types (InputEvent.Type).
const (
	InputText  = "text"
	InputKey   = "key"
	InputMove  = "move"
	InputClick = "click"
)

// LayerDisk is the kind of a layer that is a whole disk image (qcow2),
// imported with `warren image import qcow2:FILE`: its environment has it
// as its only layer, and boots with --backend vm.
const LayerDisk = "disk"

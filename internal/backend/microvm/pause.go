package microvm

// pausedFile marks a sandbox whose machine was saved to stateFile and
// ended (Pause); Resume restores it.
const (
	pausedFile = "paused"
	stateFile  = "state.bin"
)

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newScreenCmd is `warren screen SBX -o shot.png`.
func newScreenCmd(a *app) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "screen SBX -o FILE.png",
		Short: "Save a screenshot of a vm sandbox's display (PNG)",
		Long: `Save what a vm sandbox's display shows now as a PNG file (- for standard
output). Only vm sandboxes (--backend vm) have a display.`,
		Example: `  warren screen $SBX -o shot.png`,
		Args:    exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef("-o FILE is required (- for standard output)")
			}
			b, err := a.client().Screen(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out == "-" {
				_, err = a.stdout.Write(b)
				return err
			}
			return os.WriteFile(out, b, 0o644)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "the PNG file to write (- for standard output)")
	return c
}

// inputEvents collects --type, --key, --move and --click in the order
// they are given on the command line (pflag calls Set in that order).
type inputEvents struct {
	events *[]api.InputEvent
	kind   string
}

func (f inputEvents) String() string { return "" }
func (f inputEvents) Type() string {
	switch f.kind {
	case api.InputMove, api.InputClick:
		return "X,Y"
	}
	return "string"
}

func (f inputEvents) Set(v string) error {
	e := api.InputEvent{Type: f.kind}
	switch f.kind {
	case api.InputText:
		e.Text = v
	case api.InputKey:
		e.Key = v
	default:
		point, button, _ := strings.Cut(v, ":")
		xs, ys, ok := strings.Cut(point, ",")
		x, errx := strconv.Atoi(xs)
		y, erry := strconv.Atoi(ys)
		if !ok || errx != nil || erry != nil || x < 0 || y < 0 {
			return fmt.Errorf("%q: want X,Y, pixels from the top left", point)
		}
		e.X, e.Y, e.Button = x, y, button
		if button != "" && f.kind != api.InputClick {
			return fmt.Errorf("a move has no button")
		}
	}
	*f.events = append(*f.events, e)
	return nil
}

// newInputCmd is `warren input SBX --type TEXT --key KEY --click X,Y`.
func newInputCmd(a *app) *cobra.Command {
	var events []api.InputEvent
	c := &cobra.Command{
		Use:   "input SBX [--type TEXT] [--key KEY] [--move X,Y] [--click X,Y[:BUTTON]]...",
		Short: "Type, press keys and click on a vm sandbox's display",
		Long: `Send keyboard and pointer events to a vm sandbox's display, in the order the
flags are given (each may repeat). --type types text as on a US keyboard;
--key presses one combination ("Return", "ctrl-alt-f2", "shift-tab"); --move
puts the pointer at a pixel of the screen; --click clicks there (left, or
middle, right, wheel-up, wheel-down after a colon).`,
		Example: `  warren input $SBX --type 'hello' --key Return --click 200,300
  warren input $SBX --key ctrl-alt-f2 --click 10,10:right`,
		Args: exactArgs(1, "one sandbox id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(events) == 0 {
				return usagef("give at least one of --type, --key, --move, --click")
			}
			return a.client().Input(cmd.Context(), args[0], events...)
		},
	}
	f := c.Flags()
	f.Var(inputEvents{&events, api.InputText}, "type", "text to type")
	f.Var(inputEvents{&events, api.InputKey}, "key", "a key combination to press")
	f.Var(inputEvents{&events, api.InputMove}, "move", "move the pointer to X,Y")
	f.Var(inputEvents{&events, api.InputClick}, "click", "click at X,Y[:BUTTON]")
	return c
}

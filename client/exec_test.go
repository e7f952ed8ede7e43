package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestExecStreamDecoding(t *testing.T) {
	for _, tc := range []struct {
		name       string
		body       string
		wantOut    string
		wantErrOut string
		wantExit   int
		wantErr    func(error) bool
	}{
		{
			name: "utf8 and base64 chunks",
			body: `{"stream":"stdout","data":"hello "}
{"stream":"stderr","data":"warn\n"}
{"stream":"stdout","data":"/w8A","encoding":"base64"}
{"stream":"stdout","data":"\n"}
{"result":{"exit_code":3,"stdout":"","stderr":"","stdout_bytes":10,"stderr_bytes":5}}
`,
			wantOut: "hello \xff\x0f\x00\n", wantErrOut: "warn\n", wantExit: 3,
		},
		{
			name: "mid-stream error",
			body: `{"stream":"stdout","data":"partial"}
{"error":{"code":"sandbox_not_found","message":"sandbox vanished"}}
`,
			wantOut: "partial",
			wantErr: func(err error) bool {
				var e *Error
				return errors.As(err, &e) && e.Code == api.CodeSandboxNotFound && e.StatusCode == 0 &&
					IsNotFound(err) && e.Message == "sandbox vanished"
			},
		},
		{
			name:    "ends without result",
			body:    `{"stream":"stdout","data":"x"}` + "\n",
			wantOut: "x",
			wantErr: func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) },
		},
		{
			name:    "bad base64",
			body:    `{"stream":"stdout","data":"!!","encoding":"base64"}` + "\n",
			wantErr: func(err error) bool { return err != nil && strings.Contains(err.Error(), "stdout chunk") },
		},
		{
			name:     "unknown event kinds are skipped",
			body:     `{"progress":1}` + "\n" + `{"result":{"exit_code":0}}` + "\n",
			wantExit: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotReq api.ExecRequest
			var accept string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				json.NewDecoder(r.Body).Decode(&gotReq)
				accept = r.Header.Get("Accept")
				w.Header().Set("Content-Type", "application/x-ndjson")
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			var out, errOut bytes.Buffer
			res, err := New(srv.URL, "").ExecStream(context.Background(), "n1-1", api.ExecRequest{Argv: []string{"x"}}, &out, &errOut)
			if !gotReq.Stream || accept != "application/x-ndjson" {
				t.Errorf("request stream=%v accept=%q; want true, application/x-ndjson", gotReq.Stream, accept)
			}
			if out.String() != tc.wantOut || errOut.String() != tc.wantErrOut {
				t.Errorf("got stdout %q stderr %q, want %q %q", out.String(), errOut.String(), tc.wantOut, tc.wantErrOut)
			}
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Errorf("got error %v (%T), not the one wanted", err, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.wantExit {
				t.Errorf("got exit %d, want %d", res.ExitCode, tc.wantExit)
			}
		})
	}
}

func TestExecStreamBufferedFallback(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"exit_code":1,"stdout":"AAE=","stdout_encoding":"base64","stderr":"e"}`)
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	res, err := New(srv.URL, "").ExecStream(context.Background(), "n1-1", api.ExecRequest{Cmd: "x"}, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "\x00\x01" || errOut.String() != "e" || res.ExitCode != 1 || res.Stdout != "" {
		t.Errorf("got stdout %q stderr %q result %+v", out.String(), errOut.String(), res)
	}
}

func TestExecBufferedDecodesBase64(t *testing.T) {
	var gotReq api.ExecRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&gotReq)
		io.WriteString(w, `{"exit_code":0,"stdout":"/w==","stdout_encoding":"base64","stderr":"ok","stdout_truncated":true,"stdout_bytes":9}`)
	}))
	defer srv.Close()
	req := api.ExecRequest{Argv: []string{"cat"}, Stream: true}
	SetStdin(&req, []byte{0xff, 0xfe})
	res, err := New(srv.URL, "").Exec(context.Background(), "n1-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if gotReq.Stream {
		t.Error("Exec sent stream=true")
	}
	if gotReq.StdinEncoding != api.EncodingBase64 || gotReq.Stdin != "//4=" {
		t.Errorf("got stdin %q (%q)", gotReq.Stdin, gotReq.StdinEncoding)
	}
	if res.Stdout != "\xff" || res.StdoutEncoding != "" || res.Stderr != "ok" || !res.StdoutTruncated || res.StdoutBytes != 9 {
		t.Errorf("got %+v", res)
	}
}

func TestExecStreamWriterErrorAborts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"stream":"stdout","data":"x"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // held open until the client goes away
	}))
	defer srv.Close()
	boom := errors.New("disk full")
	_, err := New(srv.URL, "").ExecStream(context.Background(), "n1-1", api.ExecRequest{Cmd: "x"}, failWriter{boom}, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the writer's error", err)
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

// Command portapp is a server the end-to-end tests copy into a sandbox
// (static, no cgo) and run there: "/" answers its hostname, "/headers" the
// request's headers as JSON, "/ws" is a WebSocket echo.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"

	"golang.org/x/net/websocket"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: portapp ADDR")
	}
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(r.Header)
	})
	mux.Handle("/ws", websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "portapp in %s\n", host) })
	log.Fatal(http.ListenAndServe(os.Args[1], mux))
}

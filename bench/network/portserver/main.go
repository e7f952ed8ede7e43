// Command portserver is the HTTP server bench/network runs inside a
// sandbox (built static, copied in through the files API): GET /bytes?n=N
// answers N bytes. The arguments after the address are ignored: the bench
// tags the process with one to find it from the host.
package main

import (
	"log"
	"net/http"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: portserver ADDR [TAG]")
	}
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = 'x'
	}
	http.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}

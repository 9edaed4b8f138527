package web

import (
	"embed"
	"io/fs"
	"net/http"
)

// ui holds the web console: plain HTML, CSS and JavaScript, no build step.
//
//go:embed ui
var ui embed.FS

// ConsoleCSP is the Content-Security-Policy of every /ui/ answer: the
// console loads only its own script and style files (no inline script or
// style, no eval), talks only to the origin it was served from, and may
// not be framed.
const ConsoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// consoleHandler serves the embedded console under /ui/ (GET and HEAD
// only), with a strict CSP and no caching by intermediaries. The console
// holds no secret: it asks the person for an API key and keeps it in the
// browser tab's sessionStorage.
func consoleHandler() (http.Handler, error) {
	sub, err := fs.Sub(ui, "ui")
	if err != nil {
		return nil, err
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", ConsoleCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}), nil
}

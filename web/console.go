package web

import (
	"net/http"
)

// consoleHandler serves the web console (not yet built: 404).
func consoleHandler() http.Handler {
	return http.NotFoundHandler()
}

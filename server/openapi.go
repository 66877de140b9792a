package server

import _ "embed"

// openapiJSON is served at /openapi.json. TestOpenAPIMatchesHandlers keeps it
// in step with the routes and the request/response structs.
//
//go:embed openapi.json
var openapiJSON []byte

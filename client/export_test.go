package client

// CallerEnded exposes callerEnded to the external tests.
var CallerEnded = callerEnded

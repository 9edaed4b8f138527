package outbox

// SetHook makes o call f at the named points of a relay round
// ("remove-sent", "park-sent", "arm-sent": after the call to delayd
// returned, before its rows are recorded or deleted) and of Once
// ("once-committed": after the commit, before the ack). The fault tests
// SIGKILL a child process there.
func SetHook(o *Outbox, f func(point string)) { o.hook = f }

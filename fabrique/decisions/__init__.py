"""The decisions a Workflow step or the safety net makes, as plain functions: what to
build (changes, plan), whether a digest is the pushed one (digest), what to write where
(targets, writeback), what each app needs now (reconcile), and the Workflow that the
three callers submit (workflow). They use the clients and the site model, never Hera."""

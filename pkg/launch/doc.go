// Package launch runs sandboxes of the executor's shape through their one life cycle, on the
// stateless runsc driver (pkg/runsc) and the spec's shape (pkg/sandbox), and is the kit's one
// restore path: what the pipeline's capture, measure, smoke test, bench and soak, the pool
// (pkg/pool) and a worker all take.
//
// # A worker
//
// A worker restores a checkpoint of an output someone else captured and calls it with this
// package alone (ExampleRestorer_Restore runs it; examples/worker is a whole worker around
// it):
//
//  1. OpenOutput(dir, OpenOptions{Rootfs, Verify: true}) opens the output once and checks
//     every field that reaches runsc (as root) or the host: the executor protocol, the runsc
//     and restore flags against the kit's allow-list, the rootfs against the manifest's
//     digest, every byte against the manifest, the restore spec (its fingerprint, nothing but
//     the pipeline's own spec with three fields of the worker's) and its process user against
//     the output's record (NewOutput says why each). Its errors match ErrOutput.
//  2. Output.CheckHost(ctx, runtime, set) checks this host: the runsc version and binary, the
//     protocol, the CPU features and cache line (manifest.CheckHost). Its errors match
//     ErrHost.
//  3. Output.Restorer(Options{Runtime, WorkDir, IDs, Env, Output}) fixes what every sandbox
//     of the worker shares: a Runtime with the output's flags (Output.Flags) and a runsc root
//     of the worker's own, a work directory only root can enter, an IDs policy (RandomIDs),
//     the environment the restored executor sees.
//  4. Optionally pool.New(ctx, pool.Options{New: restorer.NewSandbox, Size}): sandboxes
//     created ahead, so that a restore skips the sandbox's boot.
//  5. Restorer.Restore(ctx, set, RestoreOptions{Pool}) restores into a sandbox from the pool
//     or created for it and dials the executor; Restored.Call calls it, reading at most
//     what the call's answer needs (a stranger's data: decode it with pycall, print it with
//     pycall.Format); Restored.Close deletes the sandbox, which is never used again.
//
// # The life cycle
//
// A Sandbox is named by an IDs policy (a run's lease-bound Runtime.NewID, or RandomIDs), every
// ID checked before it reaches a path or runsc (CheckID); its bundle is written one way
// (NewSandbox) and its host directory handed to its spec's user inside a work directory only
// root can enter; its stdout and stderr are pipes copied into bounded logs (and, optionally,
// line by line to an Output); `runsc create` is never killed half-way (Create); its process
// starts once (Start, Open: restore -detach or a cold start, then the dial); and it is deleted
// exactly once on every path (Delete), a failed delete always reported. The pipeline's own
// sandboxes (sandbox.Spec of a run, in each mode) are made by a Launcher, which also times
// calls (TimedCall) through the same Open.
package launch

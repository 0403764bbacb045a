// Command go-worker is a Leasehold worker in Go: it runs jobs of one kind over
// WorkerService (protocol 2, and 1 against older servers), with the stubs in
// generated/go. README.md says how to build and configure it.
//
// Its handler follows a fixed contract (the worker conformance tool tests it):
// the payload's optional `checkpoint` (an object) is saved as the attempt's
// checkpoint, then it waits `sleep_ms` ms (stopping early on a cancel or a
// lost lease), then returns {"echo": payload.echo, "resumed_from": the
// checkpoint this attempt arrived with}. Replace handle() with your own work.
//
// Attempts are keyed by job id and lease token together, never by job id alone: a
// worker that froze past its lease may be handed the job's next attempt while it
// still holds the old one. Nor by token alone: the jobs of one Claim share one token.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "leasehold.dev/go/leasehold/v1"
)

const (
	spokenProtocol = 2 // the highest WorkerService protocol this worker speaks (it speaks 1 too)
	claimWait      = 20 * time.Second
	callTimeout    = 10 * time.Second
	writeDeadline  = 30 * time.Second // how long a finishing write is retried
	defaultBeat    = 10 * time.Second // until a claimed job advises its interval
)

// Why an attempt's context was cancelled. A stronger reason overrides a weaker one:
// a lost lease means write nothing, whatever else was asked before.
const (
	running   = iota
	shutdown  // the SIGTERM grace ran out: Snooze, so the job runs again soon
	cancelled // its owner asked: ConfirmCancel
	lost      // the lease is gone: write nothing more
)

var (
	errLost       = errors.New("lease lost")
	errBadPayload = errors.New(`payload: "sleep_ms" must be a number and "checkpoint" an object`)
)

// lease names one attempt: fencing is per (job id, lease token).
type lease struct{ job, token string }

// attempt is one claimed attempt of a job.
type attempt struct {
	job      *pb.ClaimedJob
	ctx      context.Context // the handler's: cancelled on cancel, lost lease or shutdown
	cancel   context.CancelFunc
	why      int           // guarded by worker.mu
	expires  time.Time     // guarded by worker.mu: the last lease expiry the server gave
	interval time.Duration // the heartbeat interval the claim advised (a third of the lease)
	settled  bool          // guarded by worker.mu: the handler has returned
	timer    *time.Timer   // guarded by worker.mu: stops the handler if no renewal comes
}

type worker struct {
	client      pb.WorkerServiceClient
	id, kind    string
	protocol    int32
	concurrency int
	freed       chan struct{} // nudged when an attempt ends (a slot is free)
	beatNow     chan struct{} // nudged when a heartbeat should not wait for the interval
	running     sync.WaitGroup
	mu          sync.Mutex
	held        map[lease]*attempt
	interval    time.Duration // the shortest heartbeat interval any claim advised
}

// stop cancels the attempt's handler for `why` (keeping the strongest reason).
func (w *worker) stop(a *attempt, why int) {
	w.mu.Lock()
	if why > a.why {
		a.why = why
	}
	w.mu.Unlock()
	a.cancel()
}

// holdUntil records the lease's new expiry and re-arms the attempt's lease timer.
// Unless a renewal moves the expiry again, the handler is stopped as a lost lease
// while a sixth of what is left remains (at most a sixth of a whole lease): once
// the lease expires the job may be recovered and run by another worker, so this
// one must have stopped by then. The margin covers the claim's own latency and the
// handler's moment to stop.
func (w *worker) holdUntil(a *attempt, expires time.Time) {
	left := time.Until(expires)
	margin := left
	if margin < 0 {
		margin = 0
	}
	if whole := 3 * a.interval; margin > whole {
		margin = whole
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	a.expires = expires
	if a.timer != nil {
		a.timer.Stop()
	}
	a.timer = time.AfterFunc(left-margin/6, func() { w.unrenewed(a) })
}

// unrenewed stops a handler whose lease no renewal reached in time: the server may
// be out of reach, or unable to reach its database. A handler that has returned is
// left to its outcome's write, which the server fences.
func (w *worker) unrenewed(a *attempt) {
	if why, _ := w.state(a); why == lost || w.isSettled(a) {
		return
	}
	logEvent("job.lease_unrenewed", "job_id", a.job.Job.Id, "attempt", a.job.Job.Attempt)
	w.stop(a, lost)
}

func (w *worker) isSettled(a *attempt) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return a.settled
}

func (w *worker) state(a *attempt) (why int, expires time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return a.why, a.expires
}

// attempts lists the held attempts.
func (w *worker) attempts() []*attempt {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := make([]*attempt, 0, len(w.held))
	for _, a := range w.held {
		list = append(list, a)
	}
	return list
}

func ref(a *attempt) *pb.LeaseRef {
	return &pb.LeaseRef{JobId: a.job.Job.Id, LeaseToken: a.job.LeaseToken}
}

// claimLoop long-polls for as many jobs as there are free slots until stop.
func (w *worker) claimLoop(stop context.Context) error {
	for stop.Err() == nil {
		held := w.attempts()
		if len(held) >= w.concurrency {
			select {
			case <-w.freed:
			case <-stop.Done():
			}
			continue
		}
		// Name the running attempts (their contexts not yet cancelled) so that a cancel
		// or a lost lease ends the wait; one whose news came would end every wait at once.
		var refs []*pb.LeaseRef
		for _, a := range held {
			if a.ctx.Err() == nil && w.protocol >= 2 {
				refs = append(refs, ref(a))
			}
		}
		asked := time.Now()
		ctx, cancel := context.WithTimeout(stop, claimWait+callTimeout)
		resp, err := w.client.Claim(ctx, &pb.ClaimRequest{
			WorkerId: w.id, Kinds: []string{w.kind}, MaxJobs: int32(w.concurrency - len(held)),
			WaitSeconds: claimWait.Seconds(), HeldLeases: refs,
		})
		cancel()
		switch code := status.Code(err); {
		case stop.Err() != nil:
			return nil // an abandoned poll takes no job with it
		case code == codes.Unauthenticated || code == codes.PermissionDenied || code == codes.InvalidArgument:
			return err // retrying cannot help
		case err != nil:
			logEvent("worker.claim_failed", "code", code.String())
			sleep(stop, time.Second) // the server may be restarting or draining
			continue
		}
		for _, state := range resp.Held { // it names the job, not the attempt
			var mine []*attempt
			for _, a := range held {
				if a.job.Job.Id == state.JobId {
					mine = append(mine, a)
				}
			}
			if len(mine) == 1 {
				w.learn(mine[0], state)
			} else {
				nudge(w.beatNow) // two attempts of one job: a heartbeat, answered per lease, tells
			}
		}
		for _, job := range resp.Jobs {
			w.start(job)
		}
		if len(resp.Jobs) == 0 && len(resp.Held) == 0 && time.Since(asked) < claimWait/2 {
			sleep(stop, time.Second) // empty long before the wait was up: a draining server
		}
	}
	return nil
}

func (w *worker) start(job *pb.ClaimedJob) {
	interval := time.Duration(job.HeartbeatIntervalSeconds * float64(time.Second))
	if interval <= 0 {
		interval = defaultBeat
	}
	a := &attempt{job: job, interval: interval}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	w.holdUntil(a, job.LeaseExpiresAt.AsTime())
	w.mu.Lock()
	key := lease{job.Job.Id, job.LeaseToken}
	w.held[key] = a
	if interval < w.interval {
		w.interval = interval
		nudge(w.beatNow) // the loop is waiting out a longer interval
	}
	w.mu.Unlock()
	// A job handed over with little lease left (a slow network, a frozen process)
	// is renewed now, not an interval later.
	if time.Until(job.LeaseExpiresAt.AsTime()) < interval {
		nudge(w.beatNow)
	}
	if job.Job.CancelRequestedAt != nil {
		w.stop(a, cancelled)
	}
	w.running.Add(1)
	go func() {
		defer func() {
			a.cancel()
			w.mu.Lock()
			a.timer.Stop()
			delete(w.held, key)
			w.mu.Unlock()
			nudge(w.freed)
			w.running.Done()
		}()
		logEvent("job.started", "job_id", job.Job.Id, "attempt", job.Job.Attempt)
		result, err := w.handle(a)
		w.mu.Lock()
		a.settled = true
		w.mu.Unlock()
		a.cancel() // the handler is done: its lease is renewed until the outcome is written, but named in no more Claims
		w.finish(a, result, err)
	}()
}

// handle is the job's work: the handler contract in the comment at the top.
func (w *worker) handle(a *attempt) (map[string]interface{}, error) {
	payload := a.job.Payload.AsMap() // JSON values: float64, string, bool, nil, maps, slices
	sleepMs, ok := payload["sleep_ms"].(float64)
	if _, present := payload["sleep_ms"]; present && !ok {
		return nil, errBadPayload
	}
	if checkpoint, present := payload["checkpoint"]; present {
		object, ok := checkpoint.(map[string]interface{})
		if !ok {
			return nil, errBadPayload
		}
		if err := w.saveCheckpoint(a, object); err != nil {
			return nil, err
		}
	}
	if err := a.ctx.Err(); err != nil { // cancelled before it began
		return nil, err
	}
	select {
	case <-time.After(time.Duration(sleepMs * float64(time.Millisecond))):
	case <-a.ctx.Done():
		return nil, a.ctx.Err()
	}
	var resumedFrom interface{} // null unless an earlier attempt saved a checkpoint
	if a.job.Checkpoint != nil {
		resumedFrom = a.job.Checkpoint.AsMap()
	}
	return map[string]interface{}{"echo": payload["echo"], "resumed_from": resumedFrom}, nil
}

// saveCheckpoint sends the checkpoint in a Heartbeat of its own and waits for the
// answer, so the handler knows it is stored before going on. Protocol 1 has none.
func (w *worker) saveCheckpoint(a *attempt, checkpoint map[string]interface{}) error {
	if w.protocol < 2 {
		return nil
	}
	value, err := structpb.NewStruct(checkpoint)
	if err != nil {
		return err
	}
	lease := ref(a)
	lease.Checkpoint = value
	var resp *pb.HeartbeatResponse
	err = w.write(a, func(ctx context.Context) (err error) {
		resp, err = w.client.Heartbeat(ctx, &pb.HeartbeatRequest{Leases: []*pb.LeaseRef{lease}})
		return err
	})
	if err != nil {
		return err
	}
	if len(resp.States) == 1 {
		w.learn(a, resp.States[0])
	}
	if why, _ := w.state(a); why == lost {
		return errLost
	}
	logEvent("job.checkpointed", "job_id", a.job.Job.Id, "attempt", a.job.Job.Attempt)
	return nil
}

// finish ends the attempt with one finishing write chosen by how and why it stopped.
func (w *worker) finish(a *attempt, result map[string]interface{}, err error) {
	id, token := a.job.Job.Id, a.job.LeaseToken
	why, _ := w.state(a)
	var call func(context.Context) error
	outcome := "completed"
	switch {
	case why == lost:
		err, outcome = errLost, "dropped"
	case why == cancelled:
		outcome, call = "cancelled", func(ctx context.Context) error {
			_, err := w.client.ConfirmCancel(ctx, &pb.ConfirmCancelRequest{JobId: id, LeaseToken: token})
			return err
		}
	case why == shutdown && err != nil:
		outcome, call = "snoozed", func(ctx context.Context) error {
			_, err := w.client.Snooze(ctx, &pb.SnoozeRequest{JobId: id, LeaseToken: token, DelaySeconds: 1})
			return err
		}
	case err == nil:
		var value *structpb.Struct // every Value in it has its kind set (nil becomes null_value)
		if value, err = structpb.NewStruct(result); err == nil {
			call = func(ctx context.Context) error {
				_, err := w.client.Complete(ctx, &pb.CompleteRequest{JobId: id, LeaseToken: token, Result: value})
				return err
			}
		}
	}
	if call == nil && why != lost { // the handler failed, or its result is not JSON
		request := &pb.FailRequest{
			JobId: id, LeaseToken: token, ErrorMessage: err.Error(), ErrorType: "GoWorkerError",
			NonRetryable: errors.Is(err, errBadPayload), // a bad payload stays bad
		}
		outcome, call = "failed: "+err.Error(), func(ctx context.Context) error {
			_, err := w.client.Fail(ctx, request)
			return err
		}
	}
	if call != nil {
		if err = w.write(a, call); err != nil {
			outcome = "not recorded: " + err.Error()
		}
	}
	logEvent("job.finished", "job_id", id, "attempt", a.job.Job.Attempt, "outcome", outcome)
}

// write makes one fenced call, retried after UNAVAILABLE or DEADLINE_EXCEEDED with
// the same lease token while the lease holds: protocol 2 answers a repeated finishing
// write as the first one was answered. ABORTED means the lease is gone: stop.
func (w *worker) write(a *attempt, call func(context.Context) error) error {
	giveUp := time.Now().Add(writeDeadline)
	for pause := 200 * time.Millisecond; ; pause *= 2 {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := call(ctx)
		cancel()
		switch status.Code(err) {
		case codes.Aborted:
			w.stop(a, lost)
			return errLost
		case codes.Unavailable, codes.DeadlineExceeded:
			// Even after news of a lost lease: the write may have landed (the next
			// heartbeat then reports the finished lease lost), and a repeat tells.
			_, expires := w.state(a)
			if time.Now().Add(pause).After(expires) || time.Now().After(giveUp) {
				return err
			}
			logEvent("job.write_retried", "job_id", a.job.Job.Id, "code", status.Code(err).String())
			time.Sleep(pause)
		default:
			return err
		}
	}
}

// heartbeatLoop renews every held lease in one call per interval until done.
func (w *worker) heartbeatLoop(done <-chan struct{}) {
	for {
		w.mu.Lock()
		interval := w.interval
		w.mu.Unlock()
		select {
		case <-done:
			return
		case <-w.beatNow:
		case <-time.After(interval):
		}
		w.beat(interval)
	}
}

func (w *worker) beat(interval time.Duration) {
	var live []*attempt
	var leases []*pb.LeaseRef
	for _, a := range w.attempts() {
		// One no renewal reached in time was stopped by its own lease timer.
		if why, _ := w.state(a); why != lost {
			live, leases = append(live, a), append(leases, ref(a))
		}
	}
	if len(leases) == 0 {
		return
	}
	timeout := 2 * interval // the wire guide's deadline: twice the interval, at least a second
	if timeout < time.Second {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := w.client.Heartbeat(ctx, &pb.HeartbeatRequest{Leases: leases})
	if err != nil {
		logEvent("worker.heartbeat_failed", "code", status.Code(err).String())
		return // try again at the next interval
	}
	for i, state := range resp.States { // one per lease sent, in the same order
		if i < len(live) {
			w.learn(live[i], state)
		}
	}
}

// learn acts on what became of one lease.
func (w *worker) learn(a *attempt, state *pb.LeaseState) {
	switch {
	case state.Lost:
		w.stop(a, lost)
	case state.CancelRequested:
		w.stop(a, cancelled)
	}
	if state.LeaseExpiresAt != nil {
		w.holdUntil(a, state.LeaseExpiresAt.AsTime())
	}
}

// authenticated gives every call the worker token and, unless it has one, a deadline.
func authenticated(token string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn,
		invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, callTimeout)
			defer cancel()
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
}

// negotiate asks for protocol 2 (retrying while the server is unreachable) and
// learns what to speak: 1 from a server older than protocol 2.
func (w *worker) negotiate(stop context.Context) (info *pb.GetServerInfoResponse, err error) {
	for {
		info, err = w.client.GetServerInfo(stop, &pb.GetServerInfoRequest{ProtocolVersion: spokenProtocol})
		if code := status.Code(err); stop.Err() != nil || (code != codes.Unavailable && code != codes.DeadlineExceeded) {
			break
		}
		logEvent("worker.server_unavailable", "code", status.Code(err).String())
		sleep(stop, time.Second)
	}
	if err == nil && (info.ProtocolVersion < 1 || info.ProtocolVersion > spokenProtocol) {
		err = fmt.Errorf("server speaks WorkerService protocol %d, this worker 1 and 2", info.ProtocolVersion)
	}
	return info, err
}

func run() error {
	server := flag.String("server", envOr("LEASEHOLD_SERVER", "127.0.0.1:50051"), "the server's HOST:PORT")
	kind := flag.String("kind", envOr("LEASEHOLD_KIND", "go.steps"), "the job kind to run (one the server's --remote-kinds covers)")
	concurrency := flag.Int("concurrency", 4, "how many jobs run at once")
	grace := flag.Duration("grace", 30*time.Second, "on SIGTERM, how long running jobs may finish before they are snoozed")
	flag.Parse()
	token := os.Getenv("LEASEHOLD_WORKER_TOKEN")
	if token == "" {
		return errors.New("LEASEHOLD_WORKER_TOKEN is not set")
	}
	transport := grpc.WithInsecure()
	if ca := os.Getenv("LEASEHOLD_TLS_CA"); ca != "" { // TLS, trusting only this CA
		creds, err := credentials.NewClientTLSFromFile(ca, "")
		if err != nil {
			return fmt.Errorf("LEASEHOLD_TLS_CA: %w", err)
		}
		transport = grpc.WithTransportCredentials(creds)
	}
	conn, err := grpc.Dial(*server, transport, grpc.WithUnaryInterceptor(authenticated(token)))
	if err != nil {
		return err
	}
	defer conn.Close()
	host, _ := os.Hostname()
	w := &worker{
		client: pb.NewWorkerServiceClient(conn), kind: *kind, id: fmt.Sprintf("go-%s-%d", host, os.Getpid()),
		concurrency: *concurrency, freed: make(chan struct{}, 1), beatNow: make(chan struct{}, 1),
		held: map[lease]*attempt{}, interval: defaultBeat,
	}
	stop, unnotify := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer unnotify()
	info, err := w.negotiate(stop)
	if err != nil || stop.Err() != nil {
		return err
	}
	w.protocol = info.ProtocolVersion
	logEvent("worker.started", "worker_id", w.id, "kind", w.kind, "protocol", w.protocol,
		"server_version", info.ServerVersion)

	done := make(chan struct{})
	go w.heartbeatLoop(done) // renews leases until every handler has finished
	err = w.claimLoop(stop)
	logEvent("worker.stopping", "running", len(w.attempts()))
	graceOver := time.AfterFunc(*grace, func() { // then snooze what is still running
		for _, a := range w.attempts() {
			w.stop(a, shutdown)
		}
	})
	w.running.Wait()
	graceOver.Stop()
	close(done)
	logEvent("worker.stopped")
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func nudge(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // a nudge is already pending
	}
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func logEvent(event string, kv ...interface{}) {
	fields := map[string]interface{}{"event": event}
	for i := 0; i+1 < len(kv); i += 2 {
		fields[kv[i].(string)] = kv[i+1]
	}
	line, _ := json.Marshal(fields)
	fmt.Fprintln(os.Stderr, string(line))
}

func main() {
	if err := run(); err != nil {
		if s, ok := status.FromError(err); ok {
			err = errors.New(s.Message())
		}
		fmt.Fprintln(os.Stderr, "go-worker:", err)
		os.Exit(2)
	}
}

// Command go-worker is a Leasehold worker in Go: it runs jobs of one kind over
// WorkerService, with the stubs in generated/go (README.md says how to build it).
//
//	LEASEHOLD_WORKER_TOKEN=... go-worker [-server HOST:PORT] [-kind KIND] [-concurrency N] [-grace D]
//
// The payload {"steps": N, "step_ms": M} steers the work: N `progress` events
// {"step": i}, M ms apart, then the result {"processed": N}. It follows every
// rule a worker must: one long-poll Claim for as many jobs as it has free
// slots; one Heartbeat for every lease it holds, every heartbeat_interval_seconds;
// on `cancel_requested`, stop and ConfirmCancel; on `lost` or ABORTED, stop and
// write nothing more; on SIGINT/SIGTERM, stop claiming, let running jobs finish
// for -grace, then Snooze what is left so that nothing waits out its lease.
//
// Attempts are keyed by lease token, not job id: a worker that froze past its
// lease may be handed the job's next attempt while it still holds the old one.
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
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	pb "leasehold.dev/go/leasehold/v1"
)

const (
	protocolVersion = 1 // GetServerInfo's; this worker uses none of protocol 2's additions
	claimWait       = 20 * time.Second
	callTimeout     = 10 * time.Second
)

var (
	errLost       = errors.New("lease lost")
	errCancelled  = errors.New("cancel requested")
	errStopping   = errors.New("worker stopping")
	errBadPayload = errors.New(`payload: "steps" and "step_ms" must be numbers`)
)

// attempt is one claimed attempt; the heartbeat loop sets its flags.
type attempt struct {
	job                        *pb.ClaimedJob
	cancelled, lost, snoozeNow atomic.Bool
}

type worker struct {
	client      pb.WorkerServiceClient
	id, kind    string
	slots       chan struct{} // holds one token per running job (and per slot a Claim asks for)
	wake        chan struct{} // the heartbeat interval got shorter
	running     sync.WaitGroup
	mu          sync.Mutex
	held        map[string]*attempt // by lease token
	heartbeatNs atomic.Int64
}

// claimLoop long-polls for as many jobs as there are free slots until stop.
func (w *worker) claimLoop(stop context.Context) error {
	for {
		select { // wait for one free slot, then take every other free one
		case w.slots <- struct{}{}:
		case <-stop.Done():
			return nil
		}
		free := 1
		for free < cap(w.slots) && trySend(w.slots) {
			free++
		}
		ctx, cancel := context.WithTimeout(stop, claimWait+callTimeout)
		resp, err := w.client.Claim(ctx, &pb.ClaimRequest{
			WorkerId: w.id, Kinds: []string{w.kind}, MaxJobs: int32(free), WaitSeconds: claimWait.Seconds(),
		})
		cancel()
		for _, job := range resp.GetJobs() {
			w.start(job) // each job frees its slot when it ends
		}
		for i := len(resp.GetJobs()); i < free; i++ {
			<-w.slots
		}
		switch code := status.Code(err); {
		case stop.Err() != nil:
			return nil // an abandoned poll takes no job with it
		case code == codes.Unauthenticated || code == codes.InvalidArgument:
			return err
		case err != nil:
			logEvent("worker.claim_failed", "code", code.String())
			time.Sleep(500 * time.Millisecond) // the server may be restarting
		}
	}
}

func (w *worker) start(job *pb.ClaimedJob) {
	a := &attempt{job: job}
	w.mu.Lock()
	w.held[job.LeaseToken] = a
	w.mu.Unlock()
	interval := time.Duration(job.HeartbeatIntervalSeconds * float64(time.Second))
	if old := w.heartbeatNs.Swap(int64(interval)); int64(interval) < old {
		trySend(w.wake) // the next heartbeat is due sooner than the loop waits
	}
	w.running.Add(1)
	go func() {
		defer func() {
			w.mu.Lock()
			delete(w.held, job.LeaseToken)
			w.mu.Unlock()
			<-w.slots
			w.running.Done()
		}()
		result, err := w.steps(a)
		w.finish(a, result, err)
	}()
}

// steps is the job's work; between steps it stops when it is told to.
func (w *worker) steps(a *attempt) (map[string]interface{}, error) {
	job := a.job.Job
	payload := a.job.Payload.AsMap()
	steps, ok1 := number(payload, "steps", 3)
	stepMs, ok2 := number(payload, "step_ms", 100)
	if !ok1 || !ok2 {
		return nil, errBadPayload
	}
	logEvent("job.started", "job_id", job.Id, "attempt", job.Attempt)
	for step := 1; step <= int(steps); step++ {
		switch {
		case a.lost.Load():
			return nil, errLost
		case a.cancelled.Load() || job.CancelRequestedAt != nil:
			return nil, errCancelled
		case a.snoozeNow.Load():
			return nil, errStopping
		}
		event, _ := structpb.NewStruct(map[string]interface{}{"step": step})
		_, err := w.client.AppendEvent(context.Background(), &pb.AppendEventRequest{
			JobId: job.Id, LeaseToken: a.job.LeaseToken, Type: "progress", Payload: event,
		})
		if err = fenced(a, err); err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(stepMs) * time.Millisecond)
	}
	return map[string]interface{}{"processed": int(steps)}, nil
}

// finish ends the attempt as steps' outcome says, with one finishing write.
func (w *worker) finish(a *attempt, result map[string]interface{}, err error) {
	ctx, id, token, outcome := context.Background(), a.job.Job.Id, a.job.LeaseToken, "completed"
	var value *structpb.Struct
	if err == nil {
		value, err = structpb.NewStruct(result) // JSON values only: numbers, strings, maps, slices...
	}
	switch {
	case err == nil:
		_, err = w.client.Complete(ctx, &pb.CompleteRequest{JobId: id, LeaseToken: token, Result: value})
	case errors.Is(err, errCancelled):
		outcome = "cancelled"
		_, err = w.client.ConfirmCancel(ctx, &pb.ConfirmCancelRequest{JobId: id, LeaseToken: token})
	case errors.Is(err, errStopping):
		outcome = "snoozed"
		_, err = w.client.Snooze(ctx, &pb.SnoozeRequest{JobId: id, LeaseToken: token, DelaySeconds: 1})
	case !errors.Is(err, errLost):
		outcome = "failed: " + err.Error()
		_, err = w.client.Fail(ctx, &pb.FailRequest{
			JobId: id, LeaseToken: token, ErrorMessage: err.Error(), ErrorType: "GoWorkerError",
			NonRetryable: errors.Is(err, errBadPayload),
		})
	}
	if err = fenced(a, err); err != nil {
		outcome = "not recorded: " + err.Error() // lease lost: the server ended the attempt
	}
	logEvent("job.finished", "job_id", id, "attempt", a.job.Job.Attempt, "outcome", outcome)
}

// fenced maps ABORTED, the answer to a write under a lost lease, to errLost.
func fenced(a *attempt, err error) error {
	if status.Code(err) == codes.Aborted {
		a.lost.Store(true)
		return errLost
	}
	return err
}

// heartbeatLoop renews every held lease in one call per interval until done.
func (w *worker) heartbeatLoop(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-w.wake:
			continue
		case <-time.After(time.Duration(w.heartbeatNs.Load())):
		}
		w.mu.Lock()
		attempts := make([]*attempt, 0, len(w.held))
		leases := make([]*pb.LeaseRef, 0, len(w.held))
		for token, a := range w.held {
			attempts = append(attempts, a)
			leases = append(leases, &pb.LeaseRef{JobId: a.job.Job.Id, LeaseToken: token})
		}
		w.mu.Unlock()
		if len(leases) == 0 {
			continue
		}
		resp, err := w.client.Heartbeat(context.Background(), &pb.HeartbeatRequest{Leases: leases})
		if err != nil {
			logEvent("worker.heartbeat_failed", "code", status.Code(err).String())
			continue
		}
		for i, state := range resp.States { // one per lease sent, in the same order
			attempts[i].cancelled.Store(state.CancelRequested)
			if state.Lost {
				attempts[i].lost.Store(true)
			}
		}
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

func run() error {
	server := flag.String("server", envOr("LEASEHOLD_SERVER", "127.0.0.1:50051"), "the server's HOST:PORT")
	kind := flag.String("kind", "go.steps", "the job kind to run (one the server's --remote-kinds covers)")
	concurrency := flag.Int("concurrency", 4, "how many jobs run at once")
	grace := flag.Duration("grace", 30*time.Second, "on SIGTERM, how long running jobs may finish before they are snoozed")
	flag.Parse()
	token := os.Getenv("LEASEHOLD_WORKER_TOKEN")
	if token == "" {
		return errors.New("LEASEHOLD_WORKER_TOKEN is not set")
	}
	conn, err := grpc.Dial(*server, grpc.WithInsecure(), grpc.WithUnaryInterceptor(authenticated(token)))
	if err != nil {
		return err
	}
	defer conn.Close()
	host, _ := os.Hostname()
	w := &worker{
		client: pb.NewWorkerServiceClient(conn), kind: *kind, id: fmt.Sprintf("go-%s-%d", host, os.Getpid()),
		slots: make(chan struct{}, *concurrency), wake: make(chan struct{}, 1), held: map[string]*attempt{},
	}
	w.heartbeatNs.Store(int64(10 * time.Second)) // until a Claim says
	info, err := w.client.GetServerInfo(context.Background(), &pb.GetServerInfoRequest{})
	if err != nil {
		return err
	}
	if info.ProtocolVersion != protocolVersion {
		return fmt.Errorf("server speaks WorkerService protocol %d, this worker %d", info.ProtocolVersion, protocolVersion)
	}
	logEvent("worker.started", "worker_id", w.id, "kind", w.kind, "server_version", info.ServerVersion)

	stop, unnotify := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer unnotify()
	done := make(chan struct{})
	go w.heartbeatLoop(done)
	err = w.claimLoop(stop)
	logEvent("worker.stopping")
	time.AfterFunc(*grace, func() { // then snooze what is still running
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, a := range w.held {
			a.snoozeNow.Store(true)
		}
	})
	w.running.Wait()
	close(done)
	return err
}

// number reads a JSON number (a float64 in a Struct) from the payload.
func number(payload map[string]interface{}, key string, fallback float64) (float64, bool) {
	value, present := payload[key]
	if !present {
		return fallback, true
	}
	n, ok := value.(float64)
	return n, ok
}

func trySend(c chan struct{}) bool {
	select {
	case c <- struct{}{}:
		return true
	default:
		return false
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

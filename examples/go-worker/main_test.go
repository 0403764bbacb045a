package main

// Unit tests of the worker's writes against a fake WorkerService client; the
// end-to-end tests against a real server are tests/examples/test_go_worker.py.
// Run with `examples/go-worker/build --test`.

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	pb "leasehold.dev/go/leasehold/v1"
)

// fakeClient answers Complete with `answers` in turn (the last one repeats);
// any other call panics (the embedded interface is nil).
type fakeClient struct {
	pb.WorkerServiceClient
	answers  []error
	requests []*pb.CompleteRequest
}

func (c *fakeClient) Complete(_ context.Context, in *pb.CompleteRequest, _ ...grpc.CallOption) (*pb.CompleteResponse, error) {
	c.requests = append(c.requests, in)
	err := c.answers[0]
	if len(c.answers) > 1 {
		c.answers = c.answers[1:]
	}
	if err != nil {
		return nil, err
	}
	return &pb.CompleteResponse{Job: &pb.Job{Id: in.JobId}}, nil
}

func newAttempt(leaseLeft time.Duration, payload map[string]interface{}) *attempt {
	value, _ := structpb.NewStruct(payload)
	a := &attempt{
		job:     &pb.ClaimedJob{Job: &pb.Job{Id: "job_1"}, LeaseToken: "token_1", Payload: value},
		expires: time.Now().Add(leaseLeft),
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a
}

func TestACompleteWhoseAnswerWasLostIsSentAgainWithTheSameToken(t *testing.T) {
	client := &fakeClient{answers: []error{status.Error(codes.Unavailable, "connection reset"), nil}}
	w, a := &worker{client: client}, newAttempt(6*time.Second, nil)
	w.finish(a, map[string]interface{}{"echo": "x"}, nil)
	if len(client.requests) != 2 {
		t.Fatalf("Complete sent %d times, want 2", len(client.requests))
	}
	for _, request := range client.requests {
		if request.JobId != "job_1" || request.LeaseToken != "token_1" {
			t.Errorf("Complete for %s/%s, want job_1/token_1", request.JobId, request.LeaseToken)
		}
	}
	if a.why == lost {
		t.Error("the answered repeat was taken for a lost lease")
	}
}

func TestAbortedIsALostLeaseAndNotRetried(t *testing.T) {
	client := &fakeClient{answers: []error{status.Error(codes.Aborted, "lease lost")}}
	w, a := &worker{client: client}, newAttempt(6*time.Second, nil)
	w.finish(a, map[string]interface{}{}, nil)
	if len(client.requests) != 1 || a.why != lost || a.ctx.Err() == nil {
		t.Fatalf("sent %d times, why %d: want 1 and the attempt stopped as lost", len(client.requests), a.why)
	}
}

func TestNoRetryOnceTheLeaseHasRunOut(t *testing.T) {
	client := &fakeClient{answers: []error{status.Error(codes.Unavailable, "down")}}
	w, a := &worker{client: client}, newAttempt(100*time.Millisecond, nil)
	w.finish(a, map[string]interface{}{}, nil)
	if len(client.requests) != 1 {
		t.Fatalf("Complete sent %d times after the lease ran out, want 1", len(client.requests))
	}
}

// The handler's result: echo and resumed_from, every Value with its kind set. Under
// protocol 1 a checkpoint is not sent (the fake client's Heartbeat would panic).
func TestTheResultEchoesAndEveryValueHasAKind(t *testing.T) {
	echo := map[string]interface{}{"snake_key": []interface{}{nil, 1.5, "s", true, map[string]interface{}{}}}
	payload := map[string]interface{}{"echo": echo, "checkpoint": map[string]interface{}{"at": 1.0}}
	client := &fakeClient{answers: []error{nil}}
	w, a := &worker{client: client, protocol: 1}, newAttempt(6*time.Second, payload)
	result, err := w.handle(a)
	w.finish(a, result, err)
	if len(client.requests) != 1 {
		t.Fatalf("Complete sent %d times, want 1", len(client.requests))
	}
	sent := client.requests[0].Result
	var check func(path string, v *structpb.Value)
	check = func(path string, v *structpb.Value) {
		switch kind := v.GetKind().(type) {
		case nil:
			t.Errorf("%s: a Value with no kind set", path)
		case *structpb.Value_StructValue:
			for key, field := range kind.StructValue.Fields {
				check(path+"."+key, field)
			}
		case *structpb.Value_ListValue:
			for _, item := range kind.ListValue.Values {
				check(path+"[]", item)
			}
		}
	}
	for key, field := range sent.Fields {
		check(key, field)
	}
	if got := sent.Fields["resumed_from"].GetKind(); got == nil {
		t.Error("resumed_from missing")
	} else if _, null := got.(*structpb.Value_NullValue); !null {
		t.Errorf("resumed_from = %v, want null", got)
	}
	if got := sent.AsMap()["echo"].(map[string]interface{})["snake_key"].([]interface{}); len(got) != 5 {
		t.Errorf("echo = %v", got)
	}
}

// A job that arrives with less lease left than a heartbeat interval is renewed at
// once; and two attempts of one job (a frozen process's old one and its successor)
// are held apart.
func TestAShortLeaseIsRenewedAtOnceAndAttemptsOfOneJobAreHeldApart(t *testing.T) {
	w := &worker{
		client: &fakeClient{answers: []error{nil}}, concurrency: 4, interval: 2 * time.Second,
		held: map[lease]*attempt{}, freed: make(chan struct{}, 1), beatNow: make(chan struct{}, 1),
	}
	claimed := func(token string, leaseLeft time.Duration) *pb.ClaimedJob {
		payload, _ := structpb.NewStruct(map[string]interface{}{"sleep_ms": 60000.0})
		return &pb.ClaimedJob{
			Job: &pb.Job{Id: "job_1"}, LeaseToken: token, Payload: payload,
			LeaseExpiresAt: timestamppb.New(time.Now().Add(leaseLeft)), HeartbeatIntervalSeconds: 2,
		}
	}
	w.start(claimed("token_1", 6*time.Second))
	if len(w.beatNow) != 0 {
		t.Fatal("a job with a full lease was renewed at once")
	}
	w.start(claimed("token_2", 500*time.Millisecond))
	if len(w.beatNow) != 1 {
		t.Error("a job with 0.5 s of lease left waits for the next beat")
	}
	if len(w.attempts()) != 2 {
		t.Errorf("%d attempts held, want 2", len(w.attempts()))
	}
	for _, a := range w.attempts() {
		w.stop(a, lost) // their handlers end at once and write nothing
	}
	w.running.Wait()
}

// A lease no renewal reaches stops its handler, as a lost lease, before it could
// expire; a renewal that comes in time moves that moment.
func TestALeaseNoRenewalReachesStopsItsHandlerBeforeItCouldExpire(t *testing.T) {
	w := &worker{held: map[lease]*attempt{}}
	unrenewed, renewed := newAttempt(0, nil), newAttempt(0, nil)
	unrenewed.interval, renewed.interval = time.Second, time.Second
	expires := time.Now().Add(3 * time.Second)
	w.holdUntil(unrenewed, expires)
	// Due to stop before the other, were its renewal not to count.
	w.holdUntil(renewed, time.Now().Add(2*time.Second))
	w.holdUntil(renewed, time.Now().Add(time.Minute))
	select {
	case <-unrenewed.ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the handler was never stopped")
	}
	if stoppedAt := time.Now(); !stoppedAt.Before(expires) {
		t.Errorf("stopped %v after the lease expired", stoppedAt.Sub(expires))
	}
	if why, _ := w.state(unrenewed); why != lost {
		t.Errorf("stopped for %d, want lost (%d)", why, lost)
	}
	if renewed.ctx.Err() != nil {
		t.Error("a handler whose lease was renewed was stopped")
	}
	w.mu.Lock()
	renewed.timer.Stop()
	w.mu.Unlock()
}

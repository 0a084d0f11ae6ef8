#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* A fault inside malloc, as heap corruption gives: a chunk freed to the unsorted bin gets
   a bad back pointer, and the next large malloc follows it while it holds its arena's lock. */
static void *corrupt_heap(void *unused) {
    char *chunk = malloc(0x500);
    volatile char *guard = malloc(0x20);  /* keeps the chunk from merging with the top */
    free(chunk);
    ((void **)chunk)[1] = (void *)0x1000;
    guard[0] = (char)(uintptr_t)malloc(0x600);
    return unused;
}

static void *null_write(void *unused) {
    *(volatile int *)0 = 1;
    return unused;
}

/* The fault on a thread of its own; the caller waits for it, as llama.cpp's main thread
   waits at its barrier. */
int fault_in_worker(int in_malloc) {
    pthread_t thread;
    pthread_create(&thread, 0, in_malloc ? corrupt_heap : null_write, 0);
    return pthread_join(thread, 0);
}

/* The fault on a thread of its own, left running: the caller goes on with Python. */
int start_faulting_worker(void) {
    pthread_t thread;
    return pthread_create(&thread, 0, null_write, 0);
}

int fault_here(void) {
    return *(volatile int *)0;
}

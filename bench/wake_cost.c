// What a wake-up costs (docs/PERFORMANCE.md, "A join's system calls"): round trips between
// two threads through pipes (each side blocks in read), on two CPUs
// or one, optionally after a pause (the CPUs go idle): wall and CPU time per round trip.
//   gcc -O2 -pthread bench/wake_cost.c -o /tmp/wake_cost; /tmp/wake_cost ROUNDS CPU2 [PAUSE_US]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
static int a[2], b[2]; static long N; static int cpu2;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void *peer(void *x){pin(cpu2);char c;for(long i=0;i<N;i++){if(read(a[0],&c,1)!=1)exit(1);if(write(b[1],&c,1)!=1)exit(1);}return 0;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){N=atol(argv[1]);cpu2=atoi(argv[2]);long gap=argc>3?atol(argv[3]):0;
 pipe(a);pipe(b);pin(0);pthread_t t;pthread_create(&t,0,peer,0);
 struct rusage r0,r1;getrusage(RUSAGE_SELF,&r0);double t0=now();char c='x';
 for(long i=0;i<N;i++){ if(gap){struct timespec g={0,gap*1000};nanosleep(&g,0);} write(a[1],&c,1);read(b[0],&c,1);}
 double t1=now();getrusage(RUSAGE_SELF,&r1);pthread_join(t,0);
 double cpu=(r1.ru_utime.tv_sec-r0.ru_utime.tv_sec)+(r1.ru_stime.tv_sec-r0.ru_stime.tv_sec)+((r1.ru_utime.tv_usec-r0.ru_utime.tv_usec)+(r1.ru_stime.tv_usec-r0.ru_stime.tv_usec))/1e6;
 printf("cpus 0,%d gap %ldus: %.1f us wall per round trip, %.1f us CPU per round trip (both threads)\n",cpu2,gap,(t1-t0)/N*1e6-gap,cpu/N*1e6);}

/* Does this machine scale to two threads? Register-bound FMA loops (default) or a 64 MB
 * memory stream ("m"), one thread then two threads with twice the work.
 *   gcc -O2 -pthread -o cpu-scaling tools/cpu-scaling.c && ./cpu-scaling && ./cpu-scaling m
 * A ratio of 0.50 per unit of work is perfect scaling. Used for the README's Speed section. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#define N 400000000L
static void* work(void* a){ double x=1.0,y=1.0000001,z=0.9999999,w=1.0; for(long i=0;i<N;i++){x=x*y+1e-9; w=w*z+1e-9;} double* r=malloc(8); *r=x+w; return r;}
/* memory-bound: stream over 64 MB */
static void* mem(void* a){ size_t n=16*1024*1024; float* b=malloc(n*4); memset(b,1,n*4); double s=0; for(int k=0;k<20;k++) for(size_t i=0;i<n;i++) s+=b[i]; double* r=malloc(8); *r=s; free(b); return r;}
double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){ void*(*f)(void*)= (c>1&&v[1][0]=='m')?mem:work; pthread_t t[2];
 double a=now(); f(0); double one=now()-a;
 a=now(); for(int i=0;i<2;i++) pthread_create(&t[i],0,f,0); for(int i=0;i<2;i++) pthread_join(t[i],0); double two=now()-a;
 printf("%s: one thread %.3f s, two threads (2x work) %.3f s, ratio per unit work %.2f\n", (f==mem)?"memory stream":"register FMA", one, two, two/(2*one)); }

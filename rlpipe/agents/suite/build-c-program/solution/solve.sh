#!/bin/bash
cat > /work/Makefile <<'MAKE'
CC ?= cc
CFLAGS = -O2 -Wall

all: bin/hello

build/%.o: src/%.c src/greet.h
	mkdir -p build
	$(CC) $(CFLAGS) -c $< -o $@

bin/hello: build/main.o build/greet.o
	mkdir -p bin
	$(CC) $(CFLAGS) $^ -o $@

clean:
	rm -rf build bin
MAKE
cd /work && make

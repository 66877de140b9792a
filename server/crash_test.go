package server

const crashWorkerEnv = "SANDBOXD_CRASH_WORKER"

func crashWorker() {}

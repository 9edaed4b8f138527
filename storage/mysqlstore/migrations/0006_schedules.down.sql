DROP TABLE IF EXISTS delayd_schedules;
